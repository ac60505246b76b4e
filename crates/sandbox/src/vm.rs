//! A prepared QuickJS VM: runtime with a counting allocator, interrupt guard, locked-down prelude.
//! Prepared ahead of time on the worker thread that will run it, used for one script, dropped.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use codemode_spec::DeadlineClock;
use rquickjs::allocator::Allocator;
use rquickjs::{Context, Ctx, Function, Object, Persistent, Runtime};
use tokio_util::sync::CancellationToken;

use crate::arena::Arena;
use crate::engine::{BridgeSlot, install_bridge};

const PRELUDE: &str = include_str!("prelude.js");

/// Heap accounting shared by the allocator and the driver. QuickJS applies its own limit only in
/// its default allocator, so this one enforces the limit and remembers that it was hit: an uncaught
/// out-of-memory can reach the host as a `null` rejection, and this flag lets us name it.
pub(crate) struct HeapState {
    arena: Arena,
    used: Cell<usize>,
    limit: Cell<usize>,
    pub(crate) peak: Cell<usize>,
    pub(crate) hit_limit: Cell<bool>,
    /// `used` when the image was saved.
    saved_used: Cell<usize>,
}

impl HeapState {
    fn new(arena: Arena) -> HeapState {
        HeapState {
            arena,
            used: Cell::new(0),
            limit: Cell::new(0),
            peak: Cell::new(0),
            hit_limit: Cell::new(false),
            saved_used: Cell::new(0),
        }
    }
    pub(crate) fn set_limit(&self, limit: usize) {
        self.limit.set(limit);
    }
    fn grow(&self, n: usize) {
        let used = self.used.get() + n;
        self.used.set(used);
        if used > self.peak.get() {
            self.peak.set(used);
        }
    }
    fn admit(&self, extra: usize) -> bool {
        if self.used.get().saturating_add(extra) > self.limit.get() {
            self.hit_limit.set(true);
            false
        } else {
            true
        }
    }
    /// The arena's reservation is used up: as far as the script can tell, that is its heap limit.
    fn exhausted<T>(&self) -> *mut T {
        self.hit_limit.set(true);
        std::ptr::null_mut()
    }
}

struct CountingAllocator(Rc<HeapState>);

fn usable(ptr: *mut u8) -> usize {
    // SAFETY: ptr came from the arena of this allocator.
    unsafe { Arena::usable_size(ptr) }
}

// SAFETY: every pointer handed out comes from the VM's arena and is released through it.
unsafe impl Allocator for CountingAllocator {
    fn alloc(&mut self, size: usize) -> *mut u8 {
        if !self.0.admit(size) {
            return std::ptr::null_mut();
        }
        let p = self.0.arena.alloc(size);
        if p.is_null() {
            return self.0.exhausted();
        }
        self.0.grow(usable(p));
        p
    }

    fn calloc(&mut self, count: usize, size: usize) -> *mut u8 {
        let Some(total) = count.checked_mul(size) else {
            return std::ptr::null_mut();
        };
        let p = self.alloc(total);
        if !p.is_null() {
            // SAFETY: p holds at least `total` bytes. Arena memory is recycled, so not zero.
            unsafe { p.write_bytes(0, total) };
        }
        p
    }

    unsafe fn dealloc(&mut self, ptr: *mut u8) {
        if ptr.is_null() {
            return;
        }
        self.0
            .used
            .set(self.0.used.get().saturating_sub(usable(ptr)));
        // SAFETY: ptr is ours (see the trait contract).
        unsafe { self.0.arena.free(ptr) };
    }

    unsafe fn realloc(&mut self, ptr: *mut u8, new_size: usize) -> *mut u8 {
        if ptr.is_null() {
            return self.alloc(new_size);
        }
        if new_size == 0 {
            // SAFETY: same contract as dealloc.
            unsafe { self.dealloc(ptr) };
            return std::ptr::null_mut();
        }
        let old = usable(ptr);
        if new_size > old && !self.0.admit(new_size - old) {
            return std::ptr::null_mut();
        }
        // SAFETY: ptr is ours; on failure the arena leaves it untouched.
        let p = unsafe { self.0.arena.realloc(ptr, new_size) };
        if p.is_null() {
            return self.0.exhausted();
        }
        self.0.used.set(self.0.used.get().saturating_sub(old));
        self.0.grow(usable(p));
        p
    }

    unsafe fn usable_size(ptr: *mut u8) -> usize {
        usable(ptr)
    }
}

/// Why JavaScript was stopped from the outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    Timeout,
    Cpu,
    Aborted,
    /// The host ended the run (a replay that diverged, a broken bridge).
    Fatal,
    /// The script already reported its result (`exit()` then more code).
    Finished,
}

impl Stop {
    /// The value of the host's stop flag for this reason (0 means "run on").
    pub(crate) fn flag(self) -> u32 {
        match self {
            Stop::Timeout => 1,
            Stop::Cpu => 2,
            Stop::Aborted => 3,
            Stop::Fatal => 4,
            Stop::Finished => 5,
        }
    }
    pub(crate) fn from_flag(v: u32) -> Option<Stop> {
        Some(match v {
            1 => Stop::Timeout,
            2 => Stop::Cpu,
            3 => Stop::Aborted,
            4 => Stop::Fatal,
            5 => Stop::Finished,
            _ => return None,
        })
    }
}

/// The wall deadline and abort, when the VM shares a process with the host and checks them itself.
pub(crate) struct Wall {
    pub timeout: Duration,
    pub clock: DeadlineClock,
    pub abort: CancellationToken,
}

/// Limits the interrupt handler enforces while one script runs.
pub(crate) struct ActiveLimits {
    pub cpu: Duration,
    pub wall: Option<Wall>,
    /// The host's stop flag in the bridge memory (process isolation).
    pub stop_flag: Option<&'static std::sync::atomic::AtomicU32>,
}

/// Shared by the interrupt handler (polled by QuickJS while JS runs) and the engine.
#[derive(Default)]
pub(crate) struct Guard {
    pub reason: Cell<Option<Stop>>,
    pub active: RefCell<Option<ActiveLimits>>,
    pub finished: Cell<bool>,
    js_spent: Cell<Duration>,
    segment: Cell<Option<Instant>>,
}

impl Guard {
    /// Forgets everything about the last script.
    fn reset(&self) {
        self.reason.set(None);
        self.active.borrow_mut().take();
        self.finished.set(false);
        self.js_spent.set(Duration::ZERO);
        self.segment.set(None);
    }

    /// Marks the start of a stretch of JavaScript for the CPU budget.
    pub fn enter(&self) {
        self.segment.set(Some(Instant::now()));
    }
    pub fn leave(&self) {
        if let Some(s) = self.segment.take() {
            self.js_spent.set(self.js_spent.get() + s.elapsed());
        }
    }

    /// Decides whether JavaScript must stop now, remembering the first reason.
    pub fn check(&self) -> Option<Stop> {
        if let Some(r) = self.reason.get() {
            return Some(r);
        }
        if self.finished.get() {
            self.reason.set(Some(Stop::Finished));
            return self.reason.get();
        }
        let active = self.active.borrow();
        let a = active.as_ref()?;
        let mut stop = a
            .stop_flag
            .and_then(|f| Stop::from_flag(f.load(std::sync::atomic::Ordering::Relaxed)));
        if stop.is_none()
            && let Some(w) = &a.wall
        {
            if w.abort.is_cancelled() {
                stop = Some(Stop::Aborted);
            } else if w.clock.running() >= w.timeout {
                stop = Some(Stop::Timeout);
            }
        }
        if stop.is_none() {
            let current = self.segment.get().map(|s| s.elapsed()).unwrap_or_default();
            stop = (self.js_spent.get() + current >= a.cpu).then_some(Stop::Cpu);
        }
        if stop.is_some() {
            self.reason.set(stop);
        }
        stop
    }
}

/// The prelude's entry points, kept as persistents. They must be dropped before the runtime.
pub(crate) struct PreludeFns {
    pub init: Persistent<Function<'static>>,
    pub run: Persistent<Function<'static>>,
    pub settle: Persistent<Function<'static>>,
    pub finish_err: Persistent<Function<'static>>,
    /// The bridge functions are backed by Rust closures. Held here, they are never finalized
    /// while the VM lives, so restoring the image can never bring back a freed one.
    pub _bridge: [Persistent<Function<'static>>; 3],
}

/// One VM. It runs one script at a time; [`Vm::reset`] returns it to the state it was prepared in.
pub(crate) struct Vm {
    // Field order is drop order: persistents first, then the context, then the runtime.
    pub fns: Option<PreludeFns>,
    pub context: Context,
    pub runtime: Runtime,
    pub heap: Rc<HeapState>,
    pub guard: Rc<Guard>,
    pub slot: Rc<BridgeSlot>,
}

impl Drop for Vm {
    fn drop(&mut self) {
        // A persistent that outlives its runtime aborts the process (rust-stack.md 1.7).
        self.fns = None;
        self.slot.clear();
    }
}

#[derive(Debug, thiserror::Error)]
#[error("could not prepare a JavaScript VM: {0}")]
pub(crate) struct PrepareError(String);

impl Vm {
    /// Creates the runtime and context in an arena of `reserve_bytes` of address space, runs the
    /// prelude (lockdown included) and saves the result as the image each script starts from.
    pub fn prepare(reserve_bytes: usize) -> Result<Vm, PrepareError> {
        let arena = Arena::reserve(reserve_bytes).map_err(|e| PrepareError(e.to_string()))?;
        let heap = Rc::new(HeapState::new(arena));
        heap.set_limit(PRELUDE_HEAP_BYTES);
        let runtime = Runtime::new_with_alloc(CountingAllocator(heap.clone()))
            .map_err(|e| PrepareError(e.to_string()))?;
        let guard = Rc::new(Guard::default());
        let g = guard.clone();
        runtime.set_interrupt_handler(Some(Box::new(move || g.check().is_some())));
        runtime.set_max_stack_size(1024 * 1024);
        // No collection while the prelude builds the environment; the script sets its own threshold.
        runtime.set_gc_threshold(usize::MAX);
        // Everything ECMAScript needs, without WeakRef/FinalizationRegistry (collection-timed
        // callbacks would break determinism) or DOMException (not part of ECMAScript).
        use rquickjs::context::intrinsic as i;
        let context = Context::custom::<(
            i::Date,
            i::Eval,
            i::RegExpCompiler,
            i::RegExp,
            i::Json,
            i::Proxy,
            i::MapSet,
            i::TypedArrays,
            i::Promise,
            i::Performance,
        )>(&runtime)
        .map_err(|e| PrepareError(e.to_string()))?;
        let slot = Rc::new(BridgeSlot::default());
        let fns = context.with(|ctx| -> Result<PreludeFns, String> {
            let make = crate::native::eval_prelude(&ctx, PRELUDE, "codemode-prelude.js")?;
            let (call, output, done) =
                install_bridge(&ctx, slot.clone(), guard.clone()).map_err(|e| describe(&ctx, e))?;
            let bridge = [
                Persistent::save(&ctx, call.clone()),
                Persistent::save(&ctx, output.clone()),
                Persistent::save(&ctx, done.clone()),
            ];
            let freeze = crate::native::freeze_function(&ctx).map_err(|e| describe(&ctx, e))?;
            let api: Object = make
                .call((call, output, done, freeze))
                .map_err(|e| describe(&ctx, e))?;
            let get = |name: &str| -> Result<Persistent<Function<'static>>, String> {
                let f: Function = api.get(name).map_err(|e| describe(&ctx, e))?;
                Ok(Persistent::save(&ctx, f))
            };
            Ok(PreludeFns {
                init: get("init")?,
                run: get("run")?,
                settle: get("settle")?,
                finish_err: get("finishErr")?,
                _bridge: bridge,
            })
        });
        let fns = fns.map_err(PrepareError)?;
        context.with(|ctx| {
            slot.1
                .set(crate::json_out::Protos::of(ctx.as_raw().as_ptr()))
        });
        // Collect now what preparation left behind (the freeze function among it), so that no
        // finalizer of a Rust-backed object can run during a script and be undone by a restore.
        runtime.run_gc();
        heap.arena.save();
        heap.saved_used.set(heap.used.get());
        tracing::debug!(
            image_bytes = heap.arena.image_bytes(),
            heap_bytes = heap.used.get(),
            "prepared a VM"
        );
        let vm = Vm {
            fns: Some(fns),
            context,
            runtime,
            heap,
            guard,
            slot,
        };
        vm.reset();
        Ok(vm)
    }

    /// Returns the VM to the image saved by [`Vm::prepare`], discarding everything the last
    /// script did inside it, and clears the Rust-side state of its run. The caller holds no JS
    /// value from that run any more (the engine drops them all before it returns).
    pub fn reset(&self) {
        self.slot.clear();
        self.guard.reset();
        self.heap.arena.restore();
        let used = self.heap.saved_used.get();
        self.heap.used.set(used);
        self.heap.peak.set(used);
        self.heap.hit_limit.set(false);
        self.heap.set_limit(PRELUDE_HEAP_BYTES);
    }
}

/// The heap limit while the prelude builds the environment; each script sets its own.
const PRELUDE_HEAP_BYTES: usize = 64 * 1024 * 1024;

/// Bytes of Rust-side buffers (a large result, a long script) above which a thread gives freed
/// memory back to the system after the script, instead of leaving it in its malloc arena.
pub(crate) const TRIM_AFTER_BYTES: usize = 8 << 20;

/// Gives freed malloc memory back to the system. The VM's own memory is in its arena, which
/// [`Vm::reset`] and dropping return directly.
pub(crate) fn trim() {
    // SAFETY: malloc_trim has no preconditions.
    unsafe { libc::malloc_trim(0) };
}

/// Text of a pending exception, for errors that happen outside any script.
pub(crate) fn describe(ctx: &Ctx<'_>, e: rquickjs::Error) -> String {
    if matches!(e, rquickjs::Error::Exception) {
        let v = ctx.catch();
        if let Some(ex) = v.as_exception() {
            return format!(
                "{} {}",
                ex.message().unwrap_or_default(),
                ex.stack().unwrap_or_default()
            );
        }
        return format!("{v:?}");
    }
    e.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Not a timed test: prints what a reset costs here (run with `--ignored --nocapture`).
    #[test]
    #[ignore]
    fn print_prepare_and_reset_costs() {
        let t = Instant::now();
        let vm = Vm::prepare(64 << 20).unwrap();
        let prepare = t.elapsed();
        let t = Instant::now();
        for _ in 0..1000 {
            vm.reset();
        }
        println!(
            "image {} bytes, heap {} bytes; prepare {:?}, reset {:?}",
            vm.heap.arena.image_bytes(),
            vm.heap.used.get(),
            prepare,
            t.elapsed() / 1000
        );
    }
}
