//! Neighbour (ARP) and route tables the core reads; filled statically or by netlink-sync.
