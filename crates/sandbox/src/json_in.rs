//! Builds a call result in the VM straight from its JSON text: serde_json parses, and each value
//! becomes a QuickJS value as it is read. No intermediate tree on either side.
//!
//! Why not `JSON.parse`: on a large result (the benchmark's 20,000 rows, 1.3 MB) QuickJS's parser
//! spends most of its time making a string for every property name and looking it up as an atom,
//! parsing every number through `strtod`, and growing every array one element at a time. Here a
//! property name becomes an atom once per distinct name, numbers are parsed by serde_json
//! (correctly rounded, `float_roundtrip`), and an array is made in one piece from its elements.
//!
//! Anything this builder does not take (nesting deeper than serde_json's 128 levels, numbers out
//! of range, lone surrogates in escapes) fails cleanly, and the caller falls back to `JSON.parse`,
//! which gives the same value or the same error it always did.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;

use rquickjs::{Ctx, Value, qjs};
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

/// A JS value this builder owns until it hands it on.
struct Owned {
    ctx: *mut qjs::JSContext,
    v: qjs::JSValue,
}

impl Owned {
    fn into_raw(self) -> qjs::JSValue {
        let v = self.v;
        std::mem::forget(self);
        v
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: `v` is an owned reference in `ctx`.
        unsafe { qjs::JS_FreeValue(self.ctx, self.v) };
    }
}

struct Builder {
    ctx: *mut qjs::JSContext,
    /// Property names seen so far. Results repeat a few names many times, so a short list
    /// scanned from the most recent is faster than hashing every name.
    atoms: RefCell<Vec<(Box<str>, qjs::JSAtom)>>,
    /// Past this many names, a map.
    many_atoms: RefCell<HashMap<Box<str>, qjs::JSAtom>>,
    /// Elements of the arrays being read, innermost last; one buffer for the whole result.
    items: RefCell<Vec<qjs::JSValue>>,
}

const FEW_ATOMS: usize = 32;

impl Drop for Builder {
    fn drop(&mut self) {
        let atoms = self.atoms.get_mut().drain(..);
        for (_, a) in atoms.chain(self.many_atoms.get_mut().drain()) {
            // SAFETY: each atom was created by JS_NewAtomLen in `ctx` and is freed once.
            unsafe { qjs::JS_FreeAtom(self.ctx, a) };
        }
        for v in self.items.get_mut().drain(..) {
            // SAFETY: elements not handed to an array are still owned here.
            unsafe { qjs::JS_FreeValue(self.ctx, v) };
        }
    }
}

/// The VM could not allocate: the caller reports the heap limit.
const OUT_OF_MEMORY: &str = "codemode: out of memory";

impl Builder {
    fn own(&self, v: qjs::JSValue) -> Result<Owned, String> {
        // SAFETY: checking the tag of a value just returned by QuickJS.
        if unsafe { qjs::JS_IsException(v) } {
            return Err(OUT_OF_MEMORY.into());
        }
        Ok(Owned { ctx: self.ctx, v })
    }

    fn atom(&self, name: &str) -> Result<qjs::JSAtom, String> {
        let mut few = self.atoms.borrow_mut();
        if let Some((_, a)) = few.iter().find(|(n, _)| &**n == name) {
            return Ok(*a);
        }
        let mut many = self.many_atoms.borrow_mut();
        if let Some(a) = many.get(name) {
            return Ok(*a);
        }
        // SAFETY: a valid context and a pointer/length pair into `name`.
        let a = unsafe { qjs::JS_NewAtomLen(self.ctx, name.as_ptr().cast(), name.len() as _) };
        if a == qjs::JS_ATOM_NULL {
            return Err(OUT_OF_MEMORY.into());
        }
        if few.len() < FEW_ATOMS {
            few.push((name.into(), a));
        } else {
            many.insert(name.into(), a);
        }
        Ok(a)
    }

    fn string(&self, s: &str) -> Result<Owned, String> {
        // SAFETY: as above; QuickJS copies the bytes.
        self.own(unsafe { qjs::JS_NewStringLen(self.ctx, s.as_ptr().cast(), s.len() as _) })
    }
}

fn number(v: f64) -> qjs::JSValue {
    qjs::JS_NewFloat64(v)
}

struct ValueSeed<'b>(&'b Builder);

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = Owned;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Owned, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_> {
    type Value = Owned;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("JSON")
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Owned, E> {
        let v = if b { qjs::JS_TRUE } else { qjs::JS_FALSE };
        Ok(Owned { ctx: self.0.ctx, v })
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Owned, E> {
        Ok(Owned {
            ctx: self.0.ctx,
            v: number(n as f64),
        })
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Owned, E> {
        Ok(Owned {
            ctx: self.0.ctx,
            v: number(n as f64),
        })
    }
    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Owned, E> {
        Ok(Owned {
            ctx: self.0.ctx,
            v: number(n),
        })
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Owned, E> {
        self.0.string(s).map_err(E::custom)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Owned, E> {
        Ok(Owned {
            ctx: self.0.ctx,
            v: qjs::JS_NULL,
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Owned, A::Error> {
        let b = self.0;
        let from = b.items.borrow().len();
        while let Some(v) = seq.next_element_seed(ValueSeed(b))? {
            b.items.borrow_mut().push(v.into_raw());
        }
        let mut items = b.items.borrow_mut();
        let Ok(count) = i32::try_from(items.len() - from) else {
            return Err(de::Error::custom("array too long"));
        };
        // SAFETY: JS_NewArrayFrom takes ownership of every value, also when it fails; they
        // leave the buffer right after.
        let arr = unsafe { qjs::JS_NewArrayFrom(b.ctx, count, items.as_ptr().add(from)) };
        items.truncate(from);
        drop(items);
        b.own(arr).map_err(de::Error::custom)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Owned, A::Error> {
        let b = self.0;
        // SAFETY: a valid context.
        let obj = b
            .own(unsafe { qjs::JS_NewObject(b.ctx) })
            .map_err(de::Error::custom)?;
        while let Some(atom) = map.next_key_seed(KeySeed(b))? {
            let value = map.next_value_seed(ValueSeed(b))?;
            // SAFETY: `obj` is a fresh plain object; the call takes ownership of `value`.
            // Defining (not setting) makes `__proto__` an own property, as JSON.parse does.
            let r = unsafe {
                qjs::JS_DefinePropertyValue(
                    b.ctx,
                    obj.v,
                    atom,
                    value.into_raw(),
                    qjs::JS_PROP_C_W_E as i32,
                )
            };
            if r < 0 {
                return Err(de::Error::custom(OUT_OF_MEMORY));
            }
        }
        Ok(obj)
    }
}

struct KeySeed<'b>(&'b Builder);

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = qjs::JSAtom;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<qjs::JSAtom, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = qjs::JSAtom;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a property name")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<qjs::JSAtom, E> {
        self.0.atom(s).map_err(E::custom)
    }
}

/// Why [`build`] did not produce a value.
pub(crate) enum BuildError {
    /// The VM ran out of memory (its heap limit).
    OutOfMemory,
    /// Something this builder does not take; `JSON.parse` may.
    Unsupported,
}

/// Builds the value of `json` in the VM of `ctx`.
pub(crate) fn build<'js>(ctx: &Ctx<'js>, json: &str) -> Result<Value<'js>, BuildError> {
    let builder = Builder {
        ctx: ctx.as_raw().as_ptr(),
        atoms: RefCell::new(Vec::new()),
        many_atoms: RefCell::new(HashMap::new()),
        items: RefCell::new(Vec::new()),
    };
    let mut de = serde_json::Deserializer::from_str(json);
    let built = ValueSeed(&builder)
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v));
    match built {
        // SAFETY: an owned value of this context, handed to rquickjs, which frees it.
        Ok(v) => Ok(unsafe { Value::from_raw(ctx.clone(), v.into_raw()) }),
        Err(e) => {
            // A failed allocation leaves an exception pending; the caller decides what to say.
            ctx.catch();
            if e.to_string().contains(OUT_OF_MEMORY) {
                Err(BuildError::OutOfMemory)
            } else {
                Err(BuildError::Unsupported)
            }
        }
    }
}
