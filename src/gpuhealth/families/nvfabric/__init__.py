"""NVLink fabric family: each GPU's registration with its NVLink fabric, the fabric's health,
and on multi-node NVLink platforms (GB200/GB300 NVL) the tray's membership of its domain."""
