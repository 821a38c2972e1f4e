//! Secrets at rest: cloud provider credentials are stored sealed with ChaCha20-Poly1305
//! (the `chacha20poly1305` crate) under the control plane's `DENV_SECRET_KEY`, never in
//! clear, and never returned by the API (spec `17-ref-targets.md`; documented in
//! `docs/reference/config.md` and `docs/reference/rest-api.md`).
//!
//! A sealed value is the string `enc:v1:<base64 of nonce (12 bytes) ‖ ciphertext+tag>`.
//! The associated data binds it to its place (`<cloud id>/<field>`), so a sealed value
//! copied into another row or field does not open.

use base64::Engine;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Nonce};
use rand::RngCore;
use serde_json::Value;

const PREFIX: &str = "enc:v1:";
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Whether a config field holds a secret: `token`, or a name containing `secret` or
/// `key` (case-insensitive). The same rule masks them in answers.
pub fn is_secret_field(name: &str) -> bool {
    let n = name.to_lowercase();
    n == "token" || n.contains("secret") || n.contains("key")
}

/// Seals `plain` for the place `aad`.
pub fn seal(key: &[u8; 32], aad: &str, plain: &str) -> String {
    let mut nonce = [0u8; 12];
    rand::rngs::OsRng.fill_bytes(&mut nonce);
    let ct = ChaCha20Poly1305::new(key.into())
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: plain.as_bytes(),
                aad: aad.as_bytes(),
            },
        )
        .expect("encryption of an in-memory buffer cannot fail");
    let mut out = nonce.to_vec();
    out.extend(ct);
    format!("{PREFIX}{}", B64.encode(out))
}

/// Opens a value made by [`seal`] for the same `aad`. Errors: not a sealed value, or
/// sealed under another key or for another place.
pub fn open(key: &[u8; 32], aad: &str, sealed: &str) -> Result<String, String> {
    let raw = sealed
        .strip_prefix(PREFIX)
        .and_then(|b| B64.decode(b).ok())
        .filter(|r| r.len() > 12)
        .ok_or("not a sealed value")?;
    let (nonce, ct) = raw.split_at(12);
    let plain = ChaCha20Poly1305::new(key.into())
        .decrypt(
            Nonce::from_slice(nonce),
            Payload {
                msg: ct,
                aad: aad.as_bytes(),
            },
        )
        .map_err(|_| "sealed under another key or for another place")?;
    String::from_utf8(plain).map_err(|_| "sealed value is not text".to_string())
}

/// `config` with the value of every secret field sealed, at any depth (objects inside
/// objects and arrays), whatever its type: the sealed text is the value's JSON, bound to
/// `<owner>/<path>` (`path` the keys and indices joined by `.`). `Err` names the first
/// secret field's path when there is no key to seal with. `null` values stay.
pub fn seal_secrets(config: &Value, owner: &str, key: Option<&[u8; 32]>) -> Result<Value, String> {
    walk(config, "", &mut |path, v| {
        let key = key.ok_or_else(|| path.to_string())?;
        Ok(Value::String(seal(
            key,
            &format!("{owner}/{path}"),
            &v.to_string(),
        )))
    })
}

/// The inverse of [`seal_secrets`] (for the drivers that use the credentials).
pub fn open_secrets(config: &Value, owner: &str, key: &[u8; 32]) -> Result<Value, String> {
    walk(config, "", &mut |path, v| {
        let text = v
            .as_str()
            .ok_or_else(|| format!("{path}: not a sealed value"))?;
        let json =
            open(key, &format!("{owner}/{path}"), text).map_err(|e| format!("{path}: {e}"))?;
        serde_json::from_str(&json).map_err(|e| format!("{path}: {e}"))
    })
}

/// `v` with `f(path, value)` in place of every non-null value under a secret field name.
fn walk(
    v: &Value,
    path: &str,
    f: &mut dyn FnMut(&str, &Value) -> Result<Value, String>,
) -> Result<Value, String> {
    let join = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    Ok(match v {
        Value::Object(m) => {
            let mut out = serde_json::Map::new();
            for (k, x) in m {
                let p = join(k);
                let y = if is_secret_field(k) && !x.is_null() {
                    f(&p, x)?
                } else {
                    walk(x, &p, f)?
                };
                out.insert(k.clone(), y);
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(
            a.iter()
                .enumerate()
                .map(|(i, x)| walk(x, &join(&i.to_string()), f))
                .collect::<Result<_, _>>()?,
        ),
        other => other.clone(),
    })
}

/// `config` with every secret field's value, at any depth, replaced by `mask`.
pub fn mask_secrets(config: &Value, mask: &str) -> Value {
    walk(config, "", &mut |_, _| Ok(Value::String(mask.into()))).unwrap_or_else(|_| config.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sealed_values_open_only_with_their_key_and_place() {
        let (k, other) = ([7u8; 32], [8u8; 32]);
        let s = seal(&k, "cloud_1/token", "hcloud-secret");
        assert!(s.starts_with("enc:v1:") && !s.contains("hcloud-secret"));
        assert_ne!(
            s,
            seal(&k, "cloud_1/token", "hcloud-secret"),
            "fresh nonce each time"
        );
        assert_eq!(open(&k, "cloud_1/token", &s).unwrap(), "hcloud-secret");
        assert!(open(&other, "cloud_1/token", &s).is_err());
        assert!(open(&k, "cloud_2/token", &s).is_err());
        assert!(open(&k, "cloud_1/api_key", &s).is_err());
        let mut bytes = B64.decode(&s[PREFIX.len()..]).unwrap();
        bytes[20] ^= 1;
        assert!(open(
            &k,
            "cloud_1/token",
            &format!("{PREFIX}{}", B64.encode(bytes))
        )
        .is_err());
        assert!(open(&k, "cloud_1/token", "hcloud-secret").is_err());
    }

    #[test]
    fn only_secret_fields_are_sealed_and_a_missing_key_is_named() {
        let cfg = json!({"token": "t", "api_key": "k", "location": "nbg1", "n": 1});
        let k = [1u8; 32];
        let sealed = seal_secrets(&cfg, "cloud_x", Some(&k)).unwrap();
        assert_eq!(sealed["location"], "nbg1");
        assert_eq!(sealed["n"], 1);
        assert!(sealed["token"].as_str().unwrap().starts_with("enc:v1:"));
        assert!(sealed["api_key"].as_str().unwrap().starts_with("enc:v1:"));
        assert_eq!(open_secrets(&sealed, "cloud_x", &k).unwrap(), cfg);
        assert_eq!(seal_secrets(&cfg, "cloud_x", None).unwrap_err(), "api_key");
        // Credentials that are not top-level strings are sealed as well.
        let nested = json!({"auth": {"token": 12345, "user": "u"}, "pairs": [{"client_secret": ["a", "b"]}], "key": null});
        let sealed = seal_secrets(&nested, "cloud_x", Some(&k)).unwrap();
        let text = sealed.to_string();
        assert!(!text.contains("12345") && !text.contains("\"a\""), "{text}");
        assert_eq!(sealed["auth"]["user"], "u");
        assert!(sealed["pairs"][0]["client_secret"]
            .as_str()
            .unwrap()
            .starts_with("enc:v1:"));
        assert_eq!(sealed["key"], Value::Null);
        assert_eq!(open_secrets(&sealed, "cloud_x", &k).unwrap(), nested);
        assert_eq!(
            seal_secrets(&nested, "cloud_x", None).unwrap_err(),
            "auth.token"
        );
        let masked = mask_secrets(&nested, "•");
        assert_eq!(
            masked,
            json!({"auth": {"token": "•", "user": "u"}, "pairs": [{"client_secret": "•"}], "key": null})
        );
        let plain = json!({"location": "nbg1"});
        assert_eq!(seal_secrets(&plain, "cloud_x", None).unwrap(), plain);
    }
}
