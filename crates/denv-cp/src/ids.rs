//! Object ids and secrets.
//!
//! Ids are ULIDs with a type prefix (`team_`, `key_`, `prj_`, `env_`, `ver_`, `dep_`,
//! `host_`, `cmd_`, `cloud_`, `evt_`, ...), e.g. `env_01JD7Z6X…`. They come from one
//! process-wide monotonic generator, so ids made later in this process sort after
//! earlier ones (events are listed newest first by id).
//!
//! Secrets (`dak_` API key, `dst_` session, `ddc_` device code, `djt_` join token,
//! `dhs_` host secret) are 32 random bytes, hex encoded, behind their prefix; only
//! their SHA-256 ([`hash_secret`]) is stored.

use rand::RngCore;
use sha2::{Digest, Sha256};
use std::sync::Mutex;
use ulid::{Generator, Ulid};

static GENERATOR: Mutex<Option<Generator>> = Mutex::new(None);

/// A new id `<prefix>_<ULID>`, e.g. `new_id("env")` → `env_01JD7Z6X3S8Q…`.
pub fn new_id(prefix: &str) -> String {
    let ulid = {
        let mut g = GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
        g.get_or_insert_with(Generator::new)
            .generate()
            .unwrap_or_else(|_| Ulid::new())
    };
    format!("{prefix}_{ulid}")
}

/// A new secret `<prefix>_<64 hex chars>` (32 random bytes), e.g. `new_secret("dak")`.
pub fn new_secret(prefix: &str) -> String {
    let mut b = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut b);
    format!("{prefix}_{}", hex::encode(b))
}

/// SHA-256 of a secret, hex encoded (what the store keeps).
pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Constant-time equality of two byte strings (hash comparisons).
pub fn ct_eq(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// A device-flow user code: `XXXX-XXXX` from an alphabet without look-alikes.
pub fn new_user_code() -> String {
    const ALPHABET: &[u8] = b"BCDFGHJKLMNPQRSTVWXZ23456789";
    let mut rng = rand::thread_rng();
    let mut pick = || {
        let i = (rng.next_u32() as usize) % ALPHABET.len();
        ALPHABET[i] as char
    };
    let a: String = (0..4).map(|_| pick()).collect();
    let b: String = (0..4).map(|_| pick()).collect();
    format!("{a}-{b}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_prefix_and_sort_in_creation_order() {
        let a = new_id("env");
        let b = new_id("env");
        assert!(a.starts_with("env_"));
        assert_eq!(a.len(), 4 + 26);
        assert!(b > a);
    }

    #[test]
    fn secrets_hash_and_compare() {
        let s = new_secret("dak");
        assert!(s.starts_with("dak_"));
        assert_eq!(s.len(), 4 + 64);
        let h = hash_secret(&s);
        assert_eq!(h.len(), 64);
        assert!(ct_eq(&h, &hash_secret(&s)));
        assert!(!ct_eq(&h, &hash_secret("dak_other")));
    }

    #[test]
    fn user_codes_have_the_documented_shape() {
        let c = new_user_code();
        assert_eq!(c.len(), 9);
        assert_eq!(&c[4..5], "-");
        assert!(c
            .chars()
            .filter(|c| *c != '-')
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit()));
    }
}
