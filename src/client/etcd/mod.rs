//! The client's side of the etcd backend ([`crate::etcd`]): a claim is a key under a
//! lease of the process's own ([`claim_key`]), renewed by checking the key is still on that
//! lease and keeping the lease alive ([`renew`]).

pub(crate) mod claim_key;
pub(crate) mod renew;
