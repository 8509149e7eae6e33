"""DCGM family: the DCGM diagnostic (load test) and the DCGM health watches."""
