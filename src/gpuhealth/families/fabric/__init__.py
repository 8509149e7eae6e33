"""Fabric family: EFA devices and libfabric on AWS, InfiniBand ports elsewhere."""
