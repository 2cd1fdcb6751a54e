//! Zbuf: a user-level slab over 2 MiB hugepages whose objects are shared, by reference
//! count, between the NIC, the TCP stack and the application, so no payload byte is copied.
//!
//! Not implemented yet (issue "zbuf").
