//! The two VM-preparation steps that are too slow in interpreted JavaScript: loading the prelude
//! (compiled to bytecode once per process) and freezing every reachable built-in.

use std::collections::HashSet;
use std::ffi::CString;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::OnceLock;

use rquickjs::{Ctx, Function, Value, qjs};

static PRELUDE_BYTECODE: OnceLock<Result<Vec<u8>, String>> = OnceLock::new();

fn take_exception(ctx: &Ctx<'_>) -> String {
    let v = ctx.catch();
    match v.as_exception() {
        Some(e) => e.message().unwrap_or_default(),
        None => format!("{v:?}"),
    }
}

fn compile(ctx: &Ctx<'_>, source: &str, filename: &str) -> Result<Vec<u8>, String> {
    let src = CString::new(source).map_err(|e| e.to_string())?;
    let name = CString::new(filename).map_err(|e| e.to_string())?;
    let raw = ctx.as_raw().as_ptr();
    // SAFETY: valid context and NUL-terminated strings; every returned value is freed below.
    unsafe {
        let func = qjs::JS_Eval(
            raw,
            src.as_ptr(),
            source.len() as _,
            name.as_ptr(),
            (qjs::JS_EVAL_TYPE_GLOBAL | qjs::JS_EVAL_FLAG_COMPILE_ONLY) as i32,
        );
        if qjs::JS_IsException(func) {
            return Err(take_exception(ctx));
        }
        let mut len: qjs::size_t = 0;
        let buf = qjs::JS_WriteObject(raw, &mut len, func, qjs::JS_WRITE_OBJ_BYTECODE as i32);
        qjs::JS_FreeValue(raw, func);
        if buf.is_null() {
            return Err(take_exception(ctx));
        }
        let bytes = std::slice::from_raw_parts(buf, len as usize).to_vec();
        qjs::js_free(raw, buf.cast());
        Ok(bytes)
    }
}

/// Evaluates `source` (named `filename`), reusing bytecode compiled by the first VM of the process.
pub(crate) fn eval_prelude<'js>(
    ctx: &Ctx<'js>,
    source: &str,
    filename: &str,
) -> Result<Function<'js>, String> {
    let bytes = PRELUDE_BYTECODE
        .get_or_init(|| compile(ctx, source, filename))
        .as_ref()
        .map_err(|e| format!("the prelude does not compile: {e}"))?;
    let raw = ctx.as_raw().as_ptr();
    // SAFETY: the bytecode was written by this same engine build; JS_EvalFunction consumes `obj`.
    let value = unsafe {
        let obj = qjs::JS_ReadObject(
            raw,
            bytes.as_ptr(),
            bytes.len() as _,
            qjs::JS_READ_OBJ_BYTECODE as i32,
        );
        if qjs::JS_IsException(obj) {
            return Err(take_exception(ctx));
        }
        let v = qjs::JS_EvalFunction(raw, obj);
        if qjs::JS_IsException(v) {
            return Err(take_exception(ctx));
        }
        Value::from_raw(ctx.clone(), v)
    };
    value
        .into_function()
        .ok_or_else(|| "the prelude did not evaluate to a function".to_string())
}

/// Hashes object addresses: they are unique and already well spread, so SipHash is wasted work
/// in the hottest loop of VM preparation.
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8 | u64::from(*b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64 >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Freezes every object reachable from `roots` through own properties (values and accessors,
/// string and symbol keys) and prototypes, functions included, except the global object itself,
/// which scripts may still extend. One pass per object: each property that is still configurable
/// or writable is redefined without those flags, then the object is made non-extensible, which is
/// what `Object.freeze` does, without enumerating twice.
pub(crate) fn freeze_reachable<'js>(ctx: &Ctx<'js>, roots: &[Value<'js>]) {
    let raw = ctx.as_raw().as_ptr();
    let global = ctx.globals();
    let global_ptr = unsafe { qjs::JS_VALUE_GET_PTR(global.as_raw()) } as usize;
    let mut seen: HashSet<usize, BuildHasherDefault<AddressHasher>> =
        HashSet::with_capacity_and_hasher(4096, Default::default());
    let lock_flags = qjs::JS_PROP_HAS_CONFIGURABLE as i32;
    let lock_data_flags = (qjs::JS_PROP_HAS_CONFIGURABLE | qjs::JS_PROP_HAS_WRITABLE) as i32;
    let changeable = (qjs::JS_PROP_CONFIGURABLE | qjs::JS_PROP_WRITABLE) as i32;
    // SAFETY: every value on the stack holds its own reference and is freed exactly once.
    unsafe {
        let undefined = qjs::JS_UNDEFINED;
        let mut stack: Vec<qjs::JSValue> = roots
            .iter()
            .filter(|v| v.is_object() || v.is_function())
            .map(|v| qjs::JS_DupValue(raw, v.as_raw()))
            .collect();
        let push = |stack: &mut Vec<qjs::JSValue>, v: qjs::JSValue| {
            if qjs::JS_IsObject(v) {
                stack.push(v);
            } else {
                qjs::JS_FreeValue(raw, v);
            }
        };
        while let Some(v) = stack.pop() {
            let ptr = qjs::JS_VALUE_GET_PTR(v) as usize;
            if !seen.insert(ptr) {
                qjs::JS_FreeValue(raw, v);
                continue;
            }
            let is_global = ptr == global_ptr;
            let mut tab: *mut qjs::JSPropertyEnum = std::ptr::null_mut();
            let mut len: u32 = 0;
            let flags = (qjs::JS_GPN_STRING_MASK | qjs::JS_GPN_SYMBOL_MASK) as i32;
            if qjs::JS_GetOwnPropertyNames(raw, &mut tab, &mut len, v, flags) == 0 {
                for i in 0..len as usize {
                    let atom = (*tab.add(i)).atom;
                    let mut d: qjs::JSPropertyDescriptor = std::mem::zeroed();
                    if qjs::JS_GetOwnProperty(raw, &mut d, v, atom) > 0 {
                        let accessor = d.flags & qjs::JS_PROP_GETSET as i32 != 0;
                        if !is_global && d.flags & changeable != 0 {
                            let how = if accessor {
                                lock_flags
                            } else {
                                lock_data_flags
                            };
                            if qjs::JS_DefineProperty(
                                raw, v, atom, undefined, undefined, undefined, how,
                            ) < 0
                            {
                                qjs::JS_FreeValue(raw, qjs::JS_GetException(raw));
                            }
                        }
                        push(&mut stack, d.value);
                        push(&mut stack, d.getter);
                        push(&mut stack, d.setter);
                    } else {
                        qjs::JS_FreeValue(raw, qjs::JS_GetException(raw));
                    }
                }
                qjs::JS_FreePropertyEnum(raw, tab, len);
            } else {
                qjs::JS_FreeValue(raw, qjs::JS_GetException(raw));
            }
            let proto = qjs::JS_GetPrototype(raw, v);
            if qjs::JS_IsException(proto) {
                qjs::JS_FreeValue(raw, qjs::JS_GetException(raw));
            } else {
                push(&mut stack, proto);
            }
            if !is_global && qjs::JS_PreventExtensions(raw, v) < 0 {
                qjs::JS_FreeValue(raw, qjs::JS_GetException(raw));
            }
            qjs::JS_FreeValue(raw, v);
        }
    }
}

/// `nativeFreeze(roots)` for the prelude; only the prelude ever holds it.
pub(crate) fn freeze_function<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<Function<'js>> {
    Function::new(ctx.clone(), |ctx: Ctx<'js>, roots: Vec<Value<'js>>| {
        freeze_reachable(&ctx, &roots)
    })
}
