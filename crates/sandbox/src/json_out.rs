//! JSON text of a call's arguments, written natively for plain data: objects and arrays of
//! numbers, strings, booleans and null, which is what almost every tool call passes.
//!
//! Why: `JSON.stringify` of a small object costs QuickJS about 7,500 instructions (a wrapper
//! object, a stack array, an array of the keys, a string buffer), more than anything else in a
//! call. Walking the same object through the engine's own property tables costs a fraction.
//!
//! The walk never runs JavaScript: it reads own data properties only. Whatever could make
//! `JSON.stringify` behave differently from a plain walk (a getter, `toJSON`, a proxy, a class
//! other than plain objects and arrays, a prototype other than the intrinsic ones, a BigInt, a
//! string with a lone surrogate) or make the walk large (deep nesting, many entries, long text)
//! is declined, and the prelude falls back to `JSON.stringify`, which then gives the value or
//! the error it always gave, under the VM's heap limit and interrupt handler.

use rquickjs::qjs;

/// QuickJS's class ids of plain objects and arrays (`JS_CLASS_OBJECT`, `JS_CLASS_ARRAY` in
/// quickjs.c); a test checks them against the engine.
const CLASS_OBJECT: u32 = 1;
const CLASS_ARRAY: u32 = 2;

/// Nesting the walk takes; deeper values (and cycles) go to `JSON.stringify`.
const MAX_DEPTH: u32 = 32;
/// Properties and elements the walk visits at most.
const MAX_ENTRIES: u32 = 4096;
/// Bytes of JSON the walk writes at most: bigger arguments are built inside the VM's heap
/// limit by `JSON.stringify`, not in memory the limit does not count.
const MAX_BYTES: usize = 64 * 1024;

/// The intrinsic prototypes a plain object or array may have. Lock-down froze both, so neither
/// has (or can get) a `toJSON` or an indexed property.
#[derive(Clone, Copy, Default)]
pub(crate) struct Protos {
    pub object: usize,
    pub array: usize,
}

impl Protos {
    /// Reads the prototypes of a fresh object and array in `ctx`.
    pub fn of(ctx: *mut qjs::JSContext) -> Protos {
        // SAFETY: a valid context; every value made here is freed here.
        unsafe {
            let o = qjs::JS_NewObject(ctx);
            let a = qjs::JS_NewArray(ctx);
            let po = qjs::JS_GetPrototype(ctx, o);
            let pa = qjs::JS_GetPrototype(ctx, a);
            let protos = Protos {
                object: qjs::JS_VALUE_GET_PTR(po) as usize,
                array: qjs::JS_VALUE_GET_PTR(pa) as usize,
            };
            for v in [o, a, po, pa] {
                qjs::JS_FreeValue(ctx, v);
            }
            protos
        }
    }
}

/// Declined: the caller uses `JSON.stringify`.
struct Decline;

struct Writer {
    ctx: *mut qjs::JSContext,
    protos: Protos,
    out: String,
    entries: u32,
}

/// The JSON text `JSON.stringify(value === undefined ? null : value)` gives, if the value is
/// plain data this walk takes.
pub(crate) fn plain_json(
    ctx: *mut qjs::JSContext,
    protos: Protos,
    value: qjs::JSValue,
) -> Option<String> {
    let mut w = Writer {
        ctx,
        protos,
        out: String::with_capacity(64),
        entries: 0,
    };
    // SAFETY: `value` is a live value of `ctx`, borrowed for the call.
    let tag = unsafe { qjs::JS_VALUE_GET_TAG(value) };
    if tag == qjs::JS_TAG_UNDEFINED {
        return Some("null".into());
    }
    match w.value(value, 0) {
        Ok(true) => Some(w.out),
        // A function or symbol at the top: `JSON.stringify` gives undefined there.
        Ok(false) | Err(Decline) => None,
    }
}

impl Writer {
    fn room(&mut self) -> Result<(), Decline> {
        self.entries += 1;
        if self.entries > MAX_ENTRIES || self.out.len() > MAX_BYTES {
            return Err(Decline);
        }
        Ok(())
    }

    /// Writes `v`; `Ok(false)` for what JSON leaves out (undefined, functions, symbols).
    fn value(&mut self, v: qjs::JSValue, depth: u32) -> Result<bool, Decline> {
        // SAFETY: `v` is a live value of `self.ctx` for the duration of the call.
        unsafe {
            match qjs::JS_VALUE_GET_TAG(v) {
                qjs::JS_TAG_NULL => self.out.push_str("null"),
                qjs::JS_TAG_BOOL => self.out.push_str(if qjs::JS_VALUE_GET_BOOL(v) {
                    "true"
                } else {
                    "false"
                }),
                qjs::JS_TAG_INT => {
                    let mut b = itoa::Buffer::new();
                    self.out.push_str(b.format(qjs::JS_VALUE_GET_INT(v)));
                }
                qjs::JS_TAG_FLOAT64 => {
                    let d = qjs::JS_VALUE_GET_FLOAT64(v);
                    if !d.is_finite() {
                        self.out.push_str("null");
                    } else if d == d.trunc() && d.abs() < 9.0e15 {
                        // Integral: JavaScript prints it without a fraction or exponent
                        // (and -0 as 0).
                        let mut b = itoa::Buffer::new();
                        self.out.push_str(b.format(d as i64));
                    } else {
                        // The engine's own Number-to-string, which JSON uses.
                        self.engine_text(v, false)?;
                    }
                }
                qjs::JS_TAG_STRING | qjs::JS_TAG_STRING_ROPE => self.engine_text(v, true)?,
                qjs::JS_TAG_UNDEFINED => return Ok(false),
                qjs::JS_TAG_OBJECT => {
                    // Functions (which may carry a toJSON of their own) and everything else
                    // but plain objects and arrays go to JSON.stringify.
                    if depth >= MAX_DEPTH {
                        return Err(Decline);
                    }
                    match qjs::JS_GetClassID(v) {
                        CLASS_OBJECT => self.object(v, depth)?,
                        CLASS_ARRAY => self.array(v, depth)?,
                        _ => return Err(Decline),
                    }
                }
                // Symbols are left out; BigInt throws in JSON.stringify: let it.
                qjs::JS_TAG_SYMBOL => return Ok(false),
                _ => return Err(Decline),
            }
        }
        Ok(true)
    }

    /// Whether `v`'s prototype is `want` (an intrinsic) or, for objects, null.
    fn proto_is(&self, v: qjs::JSValue, want: usize, null_ok: bool) -> bool {
        // SAFETY: a live object of `self.ctx`; the prototype reference is freed here.
        unsafe {
            let p = qjs::JS_GetPrototype(self.ctx, v);
            let tag = qjs::JS_VALUE_GET_TAG(p);
            let ok = if tag == qjs::JS_TAG_OBJECT {
                qjs::JS_VALUE_GET_PTR(p) as usize == want
            } else {
                null_ok && tag == qjs::JS_TAG_NULL
            };
            if tag == qjs::JS_TAG_EXCEPTION {
                qjs::JS_FreeValue(self.ctx, qjs::JS_GetException(self.ctx));
            } else {
                qjs::JS_FreeValue(self.ctx, p);
            }
            ok
        }
    }

    /// An own data property's value (owned), `None` when there is no such property.
    fn own_data(&self, obj: qjs::JSValue, atom: qjs::JSAtom) -> Result<Option<Owned>, Decline> {
        // SAFETY: a live object; the descriptor's values are owned and freed by `Owned`.
        unsafe {
            let mut d: qjs::JSPropertyDescriptor = std::mem::zeroed();
            match qjs::JS_GetOwnProperty(self.ctx, &mut d, obj, atom) {
                0 => Ok(None),
                r if r < 0 => {
                    qjs::JS_FreeValue(self.ctx, qjs::JS_GetException(self.ctx));
                    Err(Decline)
                }
                _ => {
                    let value = Owned(self.ctx, d.value);
                    let _getter = Owned(self.ctx, d.getter);
                    let _setter = Owned(self.ctx, d.setter);
                    if d.flags & qjs::JS_PROP_GETSET as i32 != 0 {
                        return Err(Decline);
                    }
                    Ok(Some(value))
                }
            }
        }
    }

    /// Whether `obj` has an own `toJSON`, enumerable or not, which JSON.stringify would call.
    fn has_own_to_json(&self, obj: qjs::JSValue) -> Result<bool, Decline> {
        // SAFETY: a live object; the atom is freed below.
        let r = unsafe {
            let atom = qjs::JS_NewAtomLen(self.ctx, c"toJSON".as_ptr(), 6);
            if atom == qjs::JS_ATOM_NULL {
                qjs::JS_FreeValue(self.ctx, qjs::JS_GetException(self.ctx));
                return Err(Decline);
            }
            let r = qjs::JS_GetOwnProperty(self.ctx, std::ptr::null_mut(), obj, atom);
            qjs::JS_FreeAtom(self.ctx, atom);
            r
        };
        if r < 0 {
            // SAFETY: clearing the exception just raised.
            unsafe { qjs::JS_FreeValue(self.ctx, qjs::JS_GetException(self.ctx)) };
            return Err(Decline);
        }
        Ok(r > 0)
    }

    fn object(&mut self, obj: qjs::JSValue, depth: u32) -> Result<(), Decline> {
        if !self.proto_is(obj, self.protos.object, true) || self.has_own_to_json(obj)? {
            return Err(Decline);
        }
        let names = Names::own_enumerable_strings(self.ctx, obj)?;
        self.out.push('{');
        let mut first = true;
        for &atom in names.atoms() {
            self.room()?;
            let Some(value) = self.own_data(obj, atom)? else {
                continue;
            };
            let key_at = self.out.len();
            if !first {
                self.out.push(',');
            }
            self.atom_quoted(atom)?;
            self.out.push(':');
            if self.value(value.1, depth + 1)? {
                first = false;
            } else {
                // Undefined, functions and symbols leave out the whole property.
                self.out.truncate(key_at);
            }
        }
        self.out.push('}');
        Ok(())
    }

    fn array(&mut self, arr: qjs::JSValue, depth: u32) -> Result<(), Decline> {
        if !self.proto_is(arr, self.protos.array, false) || self.has_own_to_json(arr)? {
            return Err(Decline);
        }
        let mut len: i64 = 0;
        // SAFETY: a live array; its length is an own data property.
        if unsafe { qjs::JS_GetLength(self.ctx, arr, &mut len) } < 0 {
            // SAFETY: clearing the exception just raised.
            unsafe { qjs::JS_FreeValue(self.ctx, qjs::JS_GetException(self.ctx)) };
            return Err(Decline);
        }
        if !(0..=i64::from(MAX_ENTRIES)).contains(&len) {
            return Err(Decline);
        }
        self.out.push('[');
        for i in 0..len as u32 {
            self.room()?;
            if i > 0 {
                self.out.push(',');
            }
            // SAFETY: an index atom, freed right after use.
            let atom = unsafe { qjs::JS_NewAtomUInt32(self.ctx, i) };
            if atom == qjs::JS_ATOM_NULL {
                // SAFETY: clearing the exception just raised.
                unsafe { qjs::JS_FreeValue(self.ctx, qjs::JS_GetException(self.ctx)) };
                return Err(Decline);
            }
            let got = self.own_data(arr, atom);
            // SAFETY: the atom made above.
            unsafe { qjs::JS_FreeAtom(self.ctx, atom) };
            // A hole reads through the frozen intrinsic prototypes, which have no elements:
            // undefined, written as null like undefined, functions and symbols in arrays.
            let written = match got? {
                Some(v) => self.value(v.1, depth + 1)?,
                None => false,
            };
            if !written {
                self.out.push_str("null");
            }
        }
        self.out.push(']');
        Ok(())
    }

    /// A string value (quoted) or a number (as is), through the engine's UTF-8 conversion.
    /// Lone surrogates come out as invalid UTF-8, and are declined.
    fn engine_text(&mut self, v: qjs::JSValue, quote: bool) -> Result<(), Decline> {
        let mut len: qjs::size_t = 0;
        // SAFETY: a live value; the C string is freed right after use.
        unsafe {
            let p = qjs::JS_ToCStringLen2(self.ctx, &mut len, v, false);
            if p.is_null() {
                qjs::JS_FreeValue(self.ctx, qjs::JS_GetException(self.ctx));
                return Err(Decline);
            }
            let bytes = std::slice::from_raw_parts(p.cast::<u8>(), len as usize);
            let r = match std::str::from_utf8(bytes) {
                Ok(s) if s.len() <= MAX_BYTES => {
                    if quote {
                        push_quoted(&mut self.out, s);
                    } else {
                        self.out.push_str(s);
                    }
                    Ok(())
                }
                _ => Err(Decline),
            };
            qjs::JS_FreeCString(self.ctx, p);
            r
        }
    }

    /// Writes a property name as a JSON string.
    fn atom_quoted(&mut self, atom: qjs::JSAtom) -> Result<(), Decline> {
        let mut len: qjs::size_t = 0;
        // SAFETY: a live atom; the C string is freed right after use.
        unsafe {
            let p = qjs::JS_AtomToCStringLen(self.ctx, &mut len, atom);
            if p.is_null() {
                qjs::JS_FreeValue(self.ctx, qjs::JS_GetException(self.ctx));
                return Err(Decline);
            }
            let bytes = std::slice::from_raw_parts(p.cast::<u8>(), len as usize);
            let r = match std::str::from_utf8(bytes) {
                Ok(s) => {
                    push_quoted(&mut self.out, s);
                    Ok(())
                }
                Err(_) => Err(Decline),
            };
            qjs::JS_FreeCString(self.ctx, p);
            r
        }
    }
}

/// A value reference this walk owns.
struct Owned(*mut qjs::JSContext, qjs::JSValue);

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: an owned reference in this context (undefined when the descriptor had none).
        unsafe { qjs::JS_FreeValue(self.0, self.1) };
    }
}

/// An object's own enumerable string keys, in the order JSON uses (indexes, then insertion).
struct Names {
    ctx: *mut qjs::JSContext,
    tab: *mut qjs::JSPropertyEnum,
    len: u32,
}

impl Names {
    fn own_enumerable_strings(
        ctx: *mut qjs::JSContext,
        obj: qjs::JSValue,
    ) -> Result<Names, Decline> {
        let mut tab: *mut qjs::JSPropertyEnum = std::ptr::null_mut();
        let mut len: u32 = 0;
        let flags = (qjs::JS_GPN_STRING_MASK | qjs::JS_GPN_ENUM_ONLY) as i32;
        // SAFETY: a live object; the table is freed by Drop.
        if unsafe { qjs::JS_GetOwnPropertyNames(ctx, &mut tab, &mut len, obj, flags) } < 0 {
            // SAFETY: clearing the exception just raised.
            unsafe { qjs::JS_FreeValue(ctx, qjs::JS_GetException(ctx)) };
            return Err(Decline);
        }
        Ok(Names { ctx, tab, len })
    }

    fn atoms(&self) -> impl Iterator<Item = &qjs::JSAtom> {
        // SAFETY: `tab` holds `len` entries until Drop.
        let entries: &[qjs::JSPropertyEnum] = if self.tab.is_null() {
            &[]
        } else {
            unsafe { std::slice::from_raw_parts(self.tab, self.len as usize) }
        };
        entries.iter().map(|e| &e.atom)
    }
}

impl Drop for Names {
    fn drop(&mut self) {
        // SAFETY: the table and its atoms came from JS_GetOwnPropertyNames.
        unsafe { qjs::JS_FreePropertyEnum(self.ctx, self.tab, self.len) };
    }
}

/// Appends `s` as a JSON string the way QuickJS's `JSON.stringify` writes it: `\"`, `\\`, the
/// five short escapes, other control characters as lowercase `\u00xx`, everything else as is.
fn push_quoted(out: &mut String, s: &str) {
    out.push('"');
    let mut from = 0;
    for (i, b) in s.bytes().enumerate() {
        let esc = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[from..i]);
        if esc.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.push_str("\\u00");
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 15)] as char);
        } else {
            out.push_str(esc);
        }
        from = i + 1;
    }
    out.push_str(&s[from..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::Vm;
    use rquickjs::{Ctx, Value};

    fn with_vm(f: impl FnOnce(&Ctx<'_>, Protos)) {
        let vm = Vm::prepare(64 << 20).unwrap();
        let protos = vm.slot.1.get();
        vm.context.with(|ctx| f(&ctx, protos));
    }

    fn native(ctx: &Ctx<'_>, protos: Protos, expr: &str) -> Option<String> {
        let v: Value = ctx.eval(format!("({expr})")).unwrap();
        plain_json(ctx.as_raw().as_ptr(), protos, v.as_raw())
    }

    fn stringify(ctx: &Ctx<'_>, expr: &str) -> String {
        ctx.eval(format!(
            "(() => {{ const v = ({expr}); const j = JSON.stringify(v === undefined ? null : v); return j === undefined ? \"null\" : j; }})()"
        ))
        .unwrap()
    }

    /// The class ids are the engine's, and lock-down froze the intrinsic prototypes, so no
    /// script can give them a `toJSON`, an element or an accessor.
    #[test]
    fn engine_facts_the_walk_relies_on() {
        with_vm(|ctx, _| {
            let frozen: bool = ctx
                .eval("Object.isFrozen(Object.prototype) && Object.isFrozen(Array.prototype)")
                .unwrap();
            assert!(frozen);
            let o: Value = ctx.eval("({})").unwrap();
            let a: Value = ctx.eval("[]").unwrap();
            // SAFETY: live values of this context.
            unsafe {
                assert_eq!(qjs::JS_GetClassID(o.as_raw()), CLASS_OBJECT);
                assert_eq!(qjs::JS_GetClassID(a.as_raw()), CLASS_ARRAY);
            }
        });
    }

    /// Every value the walk takes gives exactly JSON.stringify's text.
    #[test]
    fn plain_data_matches_json_stringify() {
        let cases = [
            "undefined",
            "null",
            "true",
            "false",
            "0",
            "-0",
            "7",
            "-2147483648",
            "2147483647",
            "2147483648",
            "-1e15",
            "4e15",
            "9007199254740993",
            "1e21",
            "1.5e300",
            "0.1",
            "-0.000001",
            "1e-7",
            "123.456",
            "NaN",
            "Infinity",
            "-Infinity",
            "''",
            "'plain text'",
            "'quote \" backslash \\\\ slash /'",
            "'\\b\\f\\n\\r\\t\\u0000\\u0001\\u001f\\u007f'",
            "'é ü 日本 😀 \\u2028 \\u2029'",
            "({})",
            "({ i: 1 })",
            "({ a: 1, b: 'x', c: [1, 2, { d: null }], e: { f: true } })",
            "({ 2: 'two', b: 1, 1: 'one', a: 2, '-1': 3, '01': 4 })",
            "({ 'key \"quoted\"\\n': 1, 'ключ': 2 })",
            "({ u: undefined, s: Symbol('x'), n: null, k: 1 })",
            "({ u: undefined })",
            "({ [Symbol('s')]: 1, a: 2 })",
            "Object.defineProperty({ a: 1 }, 'hidden', { value: 2, enumerable: false })",
            "Object.create(null, { a: { value: 1, enumerable: true } })",
            "(() => { const o = Object.create(null); o.x = [1]; return o; })()",
            "[]",
            "[1, 'a', null, true, [], {}]",
            "[undefined, Symbol('x')]",
            "[, 1, , 2, ,]",
            "new Array(5)",
            "(() => { const a = [1, 2, 3]; a.extra = 'no'; return a; })()",
            "(() => { const a = []; a[3] = 'x'; return a; })()",
            "(() => { const o = {}; for (let i = 0; i < 50; i++) o['k' + i] = i * 1.5; return o; })()",
            "(() => { let v = 1; for (let i = 0; i < 8; i++) v = [v, { v }]; return v; })()",
            "Object.freeze({ a: [1, 2] })",
            "'a'.repeat(100) + 'b'",
            // The global object: only its enumerable own data properties, like any object.
            "globalThis",
            "(globalThis.addedByScript = [1], { g: globalThis })",
        ];
        with_vm(|ctx, protos| {
            for c in cases {
                let want = stringify(ctx, c);
                match native(ctx, protos, c) {
                    Some(got) => assert_eq!(got, want, "{c}"),
                    None => panic!("declined {c}"),
                }
            }
        });
    }

    /// What could run script code or differ from a plain walk goes to JSON.stringify; so do
    /// values too deep, too many or too long for the walk's limits.
    #[test]
    fn anything_but_plain_data_is_declined() {
        let cases = [
            // Getters are not called here: JSON.stringify calls them.
            "({ get a() { return 1; } })",
            "({ x: { get a() { return 1; } } })",
            "(() => { const a = [1]; Object.defineProperty(a, 0, { get() { return 2; } }); return a; })()",
            // toJSON anywhere on the object itself, enumerable or not.
            "({ toJSON() { return 1; } })",
            "Object.defineProperty({}, 'toJSON', { value: () => 1 })",
            "(() => { const a = [1]; a.toJSON = () => 2; return a; })()",
            "({ d: new Date(0) })",
            // Proxies, class instances, other prototypes, boxed primitives, other classes.
            "new Proxy({}, {})",
            "new Proxy([], {})",
            "({ p: new Proxy({ a: 1 }, { get() { return 2; } }) })",
            "new (class A { constructor() { this.a = 1; } })()",
            "Object.create({ inherited: 1 })",
            "(() => { const a = [1]; Object.setPrototypeOf(a, Object.create(Array.prototype)); return a; })()",
            "new Number(1)",
            "new String('s')",
            "new Map([[1, 2]])",
            "new Uint8Array(2)",
            "new Error('e')",
            "(function () { return arguments; })(1, 2)",
            "1n",
            "({ big: 1n })",
            // A function at the top gives undefined in JSON.stringify, and may carry toJSON.
            "() => 1",
            "({ f: Object.assign(() => 1, { toJSON: () => 'f' }) })",
            "({ f: () => 1 })",
            // Lone surrogates, in values and in keys.
            "'\\ud800'",
            "({ '\\udc00': 1 })",
            // Cycles and depth.
            "(() => { const o = {}; o.o = o; return o; })()",
            "(() => { let v = 1; for (let i = 0; i < 40; i++) v = [v]; return v; })()",
            // Size.
            "new Array(5000).fill(1)",
            "'x'.repeat(70000)",
            "(() => { const s = 'y'.repeat(1000); return new Array(100).fill(s); })()",
        ];
        with_vm(|ctx, protos| {
            for c in cases {
                assert_eq!(native(ctx, protos, c), None, "{c}");
                assert!(!ctx.catch().is_exception(), "{c} left an exception behind");
            }
        });
    }
}
