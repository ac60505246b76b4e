//! Turns every binary linked with this crate into a possible worker: the host starts its own
//! executable with a marker argument, and this constructor, run by the C runtime before `main`,
//! becomes the worker and never returns. So the `codemode` binary, the benchmark, and any test
//! binary of any crate start workers without a separate executable to find or keep in step.

use std::ffi::{CStr, c_char, c_int};

use super::host::MARKER;

type InitFn = extern "C" fn(c_int, *const *const c_char, *const *const c_char);

#[used]
#[unsafe(link_section = ".init_array")]
static WORKER_ENTRY: InitFn = entry;

/// Keeps the constructor in the final binary: the sandbox refers to it when it starts.
pub(crate) fn link_entry() {
    std::hint::black_box(&WORKER_ENTRY);
}

extern "C" fn entry(argc: c_int, argv: *const *const c_char, _envp: *const *const c_char) {
    if argc < 2 || argv.is_null() {
        return;
    }
    // SAFETY: the C runtime passes argc valid, NUL-terminated argument strings.
    let args: Vec<String> = unsafe {
        let first = *argv.add(1);
        if first.is_null() || CStr::from_ptr(first).to_bytes() != MARKER.as_bytes() {
            return;
        }
        (2..argc as usize)
            .map(|i| CStr::from_ptr(*argv.add(i)).to_string_lossy().into_owned())
            .collect()
    };
    super::worker::main(&args)
}
