//! `uniqueItems` checked in linear time, whatever the items.
//!
//! jsonschema's own check hashes each item, and compares the items whose hashes match. Its hash
//! of a number is lossy where equality is exact: every integer a float cannot tell apart hashes
//! alike (2,048 of them to each float past 2^63), and each is compared with all the others. A
//! script's argument of 2^18 such integers took 1.6 s of host CPU to check (release build),
//! 2^20 several seconds, past any script's deadline and on a thread the host needs. Here a
//! number hashes by its exact value (an integer-valued number as that integer, whatever its
//! form), and every hash is keyed at random for each check, so no argument can be built to
//! collide: checking costs one pass over the items.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};

use jsonschema::paths::Location;
use jsonschema::{Keyword, ValidationError};
use serde_json::{Map, Value};

/// jsonschema's options, with `uniqueItems` checked here.
pub(crate) fn validator_options() -> jsonschema::ValidationOptions<'static> {
    jsonschema::options().with_keyword("uniqueItems", unique_items)
}

fn unique_items<'a>(
    _schema: &'a Map<String, Value>,
    value: &'a Value,
    _location: Location,
) -> Result<Box<dyn for<'i> Keyword<'i>>, ValidationError<'a>> {
    // Only `true` asks for anything; the meta-schema refuses a value that is not a boolean.
    Ok(Box::new(UniqueItems {
        on: value == &Value::Bool(true),
    }))
}

struct UniqueItems {
    on: bool,
}

impl<'i> Keyword<'i> for UniqueItems {
    fn validate(&self, instance: &'i Value) -> Result<(), ValidationError<'i>> {
        if self.is_valid(instance) {
            Ok(())
        } else {
            Err(ValidationError::custom(
                "has non-unique elements (uniqueItems: each item must differ from every other)",
            ))
        }
    }

    fn is_valid(&self, instance: &'i Value) -> bool {
        match instance {
            Value::Array(items) if self.on => all_distinct(items),
            _ => true,
        }
    }
}

/// Whether no two items are equal as JSON Schema compares them: numbers by value (`1` and
/// `1.0` are equal), objects whatever their keys' order.
pub(crate) fn all_distinct(items: &[Value]) -> bool {
    if items.len() < 2 {
        return true;
    }
    let keys = RandomState::new();
    let mut seen: HashMap<u64, Vec<&Value>> = HashMap::with_capacity(items.len());
    for item in items {
        let same_hash = seen.entry(hash(&keys, item)).or_default();
        if same_hash.iter().any(|other| equal(item, other)) {
            return false;
        }
        same_hash.push(item);
    }
    true
}

/// A number's exact value: an integer when it is one (whatever its JSON form), else its bits.
#[derive(PartialEq, Eq, Hash)]
enum Exact {
    Integer(i128),
    Fraction(u64),
}

fn exact(n: &serde_json::Number) -> Exact {
    if let Some(u) = n.as_u64() {
        return Exact::Integer(i128::from(u));
    }
    if let Some(i) = n.as_i64() {
        return Exact::Integer(i128::from(i));
    }
    let f = n.as_f64().unwrap_or(f64::NAN);
    // 2^127: every float of integer value below it converts to i128 exactly.
    const BOUND: f64 = 170_141_183_460_469_231_731_687_303_715_884_105_728.0;
    if f.fract() == 0.0 && f.abs() < BOUND {
        // `-0.0` becomes 0, equal to `0`.
        #[allow(clippy::cast_possible_truncation)]
        return Exact::Integer(f as i128);
    }
    Exact::Fraction(f.to_bits())
}

fn hash(keys: &RandomState, value: &Value) -> u64 {
    let mut h = keys.build_hasher();
    match value {
        Value::Null => 0u8.hash(&mut h),
        Value::Bool(b) => (1u8, b).hash(&mut h),
        Value::Number(n) => (2u8, exact(n)).hash(&mut h),
        Value::String(s) => (3u8, s).hash(&mut h),
        Value::Array(items) => {
            (4u8, items.len()).hash(&mut h);
            for item in items {
                hash(keys, item).hash(&mut h);
            }
        }
        Value::Object(map) => {
            // Order-free: a sum of each member's keyed hash, which no one can solve for.
            let sum = map.iter().fold(0u64, |sum, (key, value)| {
                sum.wrapping_add(keys.hash_one((key, hash(keys, value))))
            });
            (5u8, map.len(), sum).hash(&mut h);
        }
    }
    h.finish()
}

fn equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Null, Value::Null) => true,
        (Value::Bool(a), Value::Bool(b)) => a == b,
        (Value::Number(a), Value::Number(b)) => exact(a) == exact(b),
        (Value::String(a), Value::String(b)) => a == b,
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| equal(a, b))
        }
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter()
                    .all(|(key, value)| b.get(key).is_some_and(|other| equal(value, other)))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn distinct(v: Value) -> bool {
        all_distinct(v.as_array().unwrap())
    }

    #[test]
    fn equal_as_json_schema_compares() {
        assert!(!distinct(json!([1, 1.0])));
        assert!(!distinct(json!([0, -0.0])));
        assert!(!distinct(json!([{"a": 1, "b": [2]}, {"b": [2.0], "a": 1}])));
        assert!(!distinct(json!([[1, "x"], [1, "x"]])));
        assert!(!distinct(json!([null, null])));
        assert!(distinct(json!([1, 1.5, "1", true, null, [1], {"1": 1}])));
        assert!(distinct(json!([[1, 2], [2, 1]])));
        assert!(distinct(json!([{"a": 1}, {"a": 1, "b": 1}])));
        assert!(distinct(json!([])));
    }

    /// Integers a float cannot tell apart are still different.
    #[test]
    fn integers_past_a_floats_precision_are_told_apart() {
        let base = 1u64 << 63;
        assert!(distinct(json!([base, base + 1, base + 2047])));
        assert!(!distinct(json!([base + 5, base + 5])));
        assert!(!distinct(json!([base, 9_223_372_036_854_775_808.0])));
        assert!(distinct(json!([base + 1, 9_223_372_036_854_775_808.0])));
        assert!(!distinct(json!([-3, -3.0])));
        assert!(distinct(json!([1e300, 1e300 * 10.0])));
    }

    /// What made jsonschema's check quadratic: 2^18 integers in 128 runs of 2,048 that share a
    /// float. Counted in comparisons, not time: each is compared with the items of its hash.
    #[test]
    fn integers_that_share_a_float_cost_one_pass() {
        let base = 1u64 << 63;
        let items: Vec<Value> = (0..1u64 << 18).map(|k| json!(base + k)).collect();
        let keys = RandomState::new();
        let mut sizes: HashMap<u64, usize> = HashMap::new();
        for item in &items {
            *sizes.entry(hash(&keys, item)).or_default() += 1;
        }
        let largest = sizes.values().copied().max().unwrap_or_default();
        assert!(largest <= 2, "{largest} items share a hash");
        assert!(all_distinct(&items));
    }
}
