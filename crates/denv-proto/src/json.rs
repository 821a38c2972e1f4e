//! JSON helpers shared by the REST gateway, the CLI and the control plane.
//!
//! Messages serialise with their proto field names, so a response message printed with
//! [`to_json`] is the REST API's JSON body.

use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;

/// A message (or any serde value) as a `serde_json::Value`.
///
/// Panics never: every generated message serialises.
pub fn to_json<T: Serialize>(msg: &T) -> Value {
    let mut v = serde_json::to_value(msg).unwrap_or(Value::Null);
    integral_floats_to_ints(&mut v);
    v
}

/// `google.protobuf.Value` carries every number as a double, so evidence such as
/// `{"exit_code": 0}` would print as `0.0`. Whole numbers within ±2^53 are printed as
/// integers, as the REST API documents them; other floats are kept.
fn integral_floats_to_ints(v: &mut Value) {
    match v {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
                if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 {
                    *v = Value::from(f as i64);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(integral_floats_to_ints),
        Value::Object(o) => o.values_mut().for_each(integral_floats_to_ints),
        _ => {}
    }
}

/// A message from a JSON value (unknown fields ignored).
pub fn from_json<T: DeserializeOwned>(v: Value) -> Result<T, serde_json::Error> {
    serde_json::from_value(v)
}

/// A JSON object as a `google.protobuf.Struct` (non-objects give an empty struct).
pub fn to_struct(v: &Value) -> pbjson_types::Struct {
    match v {
        Value::Object(_) => serde_json::from_value(v.clone()).unwrap_or_default(),
        _ => pbjson_types::Struct::default(),
    }
}

/// A `google.protobuf.Struct` as a JSON object.
pub fn from_struct(s: &pbjson_types::Struct) -> Value {
    to_json(s)
}

/// Any JSON value as a `google.protobuf.Value`.
pub fn to_value(v: &Value) -> pbjson_types::Value {
    serde_json::from_value(v.clone()).unwrap_or_default()
}

/// A `google.protobuf.Value` as JSON.
pub fn from_value(v: &pbjson_types::Value) -> Value {
    to_json(v)
}

/// A message printed as indented JSON (the CLI's output format).
pub fn to_pretty<T: Serialize>(msg: &T) -> String {
    serde_json::to_string_pretty(&to_json(msg)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1;

    #[test]
    fn stored_objects_use_go_field_names_and_emit_every_field() {
        let env = v1::Environment {
            id: "env_1".into(),
            name: "alpha".into(),
            ..Default::default()
        };
        let j = to_json(&env);
        assert_eq!(j["ID"], "env_1");
        assert_eq!(j["Name"], "alpha");
        assert_eq!(j["CurrentVersionID"], "");
        assert!(j["Endpoints"].is_object());
    }

    #[test]
    fn requests_parse_from_snake_case_and_ignore_unknown_fields() {
        let r: v1::ExecRequest = from_json(serde_json::json!({
            "service": "box", "cmd": ["id", "-u"], "timeout_sec": 5, "extra": 1
        }))
        .unwrap();
        assert_eq!(r.service, "box");
        assert_eq!(r.cmd, vec!["id", "-u"]);
        assert_eq!(r.timeout_sec, 5);
    }

    #[test]
    fn whole_numbers_in_evidence_print_as_integers() {
        let phase = v1::Phase {
            evidence: Some(to_value(
                &serde_json::json!({"exit_code": 0, "reward": 0.5, "took_ms": 812}),
            )),
            ..Default::default()
        };
        let j = serde_json::to_string(&to_json(&phase)["Evidence"]).unwrap();
        assert_eq!(j, r#"{"exit_code":0,"reward":0.5,"took_ms":812}"#);
    }

    #[test]
    fn evidence_round_trips_through_value() {
        let ev = serde_json::json!({"reward": 1, "refused": ["a: symlink"], "agent_frozen": true});
        let v = to_value(&ev);
        assert_eq!(from_value(&v), ev);
        let s = to_struct(&ev);
        assert_eq!(from_struct(&s), ev);
    }
}
