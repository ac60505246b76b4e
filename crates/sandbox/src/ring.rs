//! Shared-memory byte rings between the host and one worker, with futex wake-ups.
//!
//! Measured on the project's machine: a round trip through shared memory with both sides spinning
//! takes about 0.2 µs; through a blocking socket, 14 to 16 µs. So messages travel through two
//! single-producer rings in a sealed memfd. A side that waits spins only while spinning can pay
//! off: while the other side is awake and on another CPU (each side publishes the CPU it runs
//! on). How long to spin adapts: it doubles after a spin that caught the answer and halves after
//! one that did not. When the other side is awake on the waiter's own CPU, spinning would only
//! delay it: the waiter hands it the CPU with `sched_yield` instead ([`Yielder`]), and sleeps on
//! a futex word in the shared memory when that does not bring the answer soon.
//!
//! A Unix socket pair stays as the second doorbell: the host sleeps on it (in tokio) while host
//! futures are running, and either side reads end of file on it when the other died.
//!
//! The host treats everything in the mapping as hostile: it keeps its own copies of its ring
//! positions, checks the worker's against them, and copies bytes out before it decodes them.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

/// Bytes in each direction's ring. Larger messages stream through in pieces.
pub(crate) const RING_BYTES: usize = 256 * 1024;
const DATA_OFFSET: usize = 4096;
/// Total size of the mapping.
pub(crate) const SHM_BYTES: usize = DATA_OFFSET + 2 * RING_BYTES;

const MAGIC: u32 = 0x636d_6272; // "cmbr"
const OFF_MAGIC: usize = 0;
const OFF_STOP: usize = 64;
const OFF_HOST_SLEEPING: usize = 128;
const OFF_WORKER_SLEEPING: usize = 192;
const OFF_TO_WORKER_HEAD: usize = 256;
const OFF_TO_WORKER_TAIL: usize = 320;
const OFF_TO_HOST_HEAD: usize = 384;
const OFF_TO_HOST_TAIL: usize = 448;
const OFF_HOST_BELL: usize = 512;
const OFF_WORKER_BELL: usize = 576;
const OFF_HOST_CPU: usize = 640;
const OFF_WORKER_CPU: usize = 704;

/// A side's sleep state: awake (running or spinning)...
pub(crate) const AWAKE: u32 = 0;
/// ...asleep on its futex word...
pub(crate) const ON_FUTEX: u32 = 1;
/// ...or asleep on the socket doorbell (the host, while host futures run).
pub(crate) const ON_SOCKET: u32 = 2;

/// The mapping. Unmapped on drop.
pub(crate) struct Shm {
    base: *mut u8,
}

// SAFETY: the mapping is plain memory; all shared words are accessed atomically.
unsafe impl Send for Shm {}
unsafe impl Sync for Shm {}

impl Drop for Shm {
    fn drop(&mut self) {
        // SAFETY: base came from mmap of SHM_BYTES.
        unsafe { libc::munmap(self.base.cast(), SHM_BYTES) };
    }
}

fn last_error(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

impl Shm {
    /// Creates a sealed memfd of [`SHM_BYTES`] and maps it. Returns the mapping and the fd to hand
    /// to the worker.
    pub fn create() -> io::Result<(Shm, OwnedFd)> {
        // SAFETY: plain syscalls on values we own.
        unsafe {
            let fd = libc::memfd_create(
                c"codemode-bridge".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            );
            if fd < 0 {
                return Err(last_error("memfd_create"));
            }
            let fd = OwnedFd::from_raw_fd(fd);
            if libc::ftruncate(fd.as_raw_fd(), SHM_BYTES as libc::off_t) != 0 {
                return Err(last_error("ftruncate"));
            }
            // A worker must never be able to shrink the file under the host's mapping.
            let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
            if libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) != 0 {
                return Err(last_error("sealing the bridge memory"));
            }
            let shm = Shm::map(fd.as_raw_fd())?;
            shm.word32(OFF_MAGIC).store(MAGIC, Ordering::Release);
            Ok((shm, fd))
        }
    }

    /// Maps an existing bridge memfd (in the worker).
    pub fn map(fd: RawFd) -> io::Result<Shm> {
        // SAFETY: mapping a file we were given; the size is fixed by the seals.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SHM_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(last_error("mapping the bridge memory"));
        }
        Ok(Shm { base: base.cast() })
    }

    pub fn magic_ok(&self) -> bool {
        self.word32(OFF_MAGIC).load(Ordering::Acquire) == MAGIC
    }

    fn word32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: off is one of the aligned control offsets inside the mapping.
        unsafe { &*(self.base.add(off) as *const AtomicU32) }
    }
    fn word64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: as above.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    /// The stop flag: written by the host, polled by the worker's interrupt handler.
    pub fn stop(&self) -> &AtomicU32 {
        self.word32(OFF_STOP)
    }

    fn ring(&self, head: usize, tail: usize, data: usize) -> RingView<'_> {
        RingView {
            head: self.word64(head),
            tail: self.word64(tail),
            // SAFETY: data..data+RING_BYTES lies inside the mapping.
            data: unsafe { self.base.add(data) },
        }
    }

    /// The host's side: it produces into the worker's ring and consumes from its own. The host
    /// keeps its positions itself (`positions`), never reading them back from the mapping.
    pub fn host_end(&self, positions: (u64, u64)) -> End<'_> {
        End {
            out: Producer {
                ring: self.ring(OFF_TO_WORKER_HEAD, OFF_TO_WORKER_TAIL, DATA_OFFSET),
                tail: positions.0,
            },
            inp: Consumer {
                ring: self.ring(OFF_TO_HOST_HEAD, OFF_TO_HOST_TAIL, DATA_OFFSET + RING_BYTES),
                head: positions.1,
            },
            me_sleeping: self.word32(OFF_HOST_SLEEPING),
            peer_sleeping: self.word32(OFF_WORKER_SLEEPING),
            my_bell: self.word32(OFF_HOST_BELL),
            peer_bell: self.word32(OFF_WORKER_BELL),
            my_cpu: self.word32(OFF_HOST_CPU),
            peer_cpu: self.word32(OFF_WORKER_CPU),
        }
    }

    /// The worker's side.
    pub fn worker_end(&self) -> End<'_> {
        End {
            out: Producer::new(self.ring(
                OFF_TO_HOST_HEAD,
                OFF_TO_HOST_TAIL,
                DATA_OFFSET + RING_BYTES,
            )),
            inp: Consumer::new(self.ring(OFF_TO_WORKER_HEAD, OFF_TO_WORKER_TAIL, DATA_OFFSET)),
            me_sleeping: self.word32(OFF_WORKER_SLEEPING),
            peer_sleeping: self.word32(OFF_HOST_SLEEPING),
            my_bell: self.word32(OFF_WORKER_BELL),
            peer_bell: self.word32(OFF_HOST_BELL),
            my_cpu: self.word32(OFF_WORKER_CPU),
            peer_cpu: self.word32(OFF_HOST_CPU),
        }
    }
}

struct RingView<'a> {
    head: &'a AtomicU64,
    tail: &'a AtomicU64,
    data: *mut u8,
}

/// The peer broke the ring's invariants: only a broken or hostile worker does that.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the worker corrupted the bridge memory ({0})")]
pub(crate) struct Corrupt(pub &'static str);

pub(crate) struct Producer<'a> {
    ring: RingView<'a>,
    /// Our own copy of the tail: the shared one is never read back.
    tail: u64,
}

impl<'a> Producer<'a> {
    fn new(ring: RingView<'a>) -> Self {
        let tail = ring.tail.load(Ordering::Acquire);
        Producer { ring, tail }
    }

    /// Free bytes, from the consumer's head checked against our tail.
    fn free(&self) -> Result<usize, Corrupt> {
        let head = self.ring.head.load(Ordering::Acquire);
        let used = self
            .tail
            .checked_sub(head)
            .filter(|u| *u <= RING_BYTES as u64)
            .ok_or(Corrupt("the reader's position is impossible"))?;
        Ok(RING_BYTES - used as usize)
    }

    /// Copies as much of `bytes` as fits and publishes it. Returns how much was written.
    pub fn write_some(&mut self, bytes: &[u8]) -> Result<usize, Corrupt> {
        let n = self.free()?.min(bytes.len());
        if n == 0 {
            return Ok(0);
        }
        let at = (self.tail % RING_BYTES as u64) as usize;
        let first = n.min(RING_BYTES - at);
        // SAFETY: both ranges lie inside the ring's data area; the bytes are free.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ring.data.add(at), first);
            std::ptr::copy_nonoverlapping(bytes.as_ptr().add(first), self.ring.data, n - first);
        }
        self.tail += n as u64;
        self.ring.tail.store(self.tail, Ordering::Release);
        Ok(n)
    }

    /// True when there is no room at all (or the reader's position is broken).
    pub fn full(&self) -> bool {
        self.free().map_or(true, |f| f == 0)
    }
}

pub(crate) struct Consumer<'a> {
    ring: RingView<'a>,
    head: u64,
}

impl<'a> Consumer<'a> {
    fn new(ring: RingView<'a>) -> Self {
        let head = ring.head.load(Ordering::Acquire);
        Consumer { ring, head }
    }

    pub fn available(&self) -> Result<usize, Corrupt> {
        let tail = self.ring.tail.load(Ordering::Acquire);
        tail.checked_sub(self.head)
            .filter(|a| *a <= RING_BYTES as u64)
            .map(|a| a as usize)
            .ok_or(Corrupt("the writer's position is impossible"))
    }

    /// Appends up to `max` available bytes to `out`, and frees them in the ring.
    pub fn read_into(&mut self, out: &mut Vec<u8>, max: usize) -> Result<usize, Corrupt> {
        let n = self.available()?.min(max);
        if n == 0 {
            return Ok(0);
        }
        let at = (self.head % RING_BYTES as u64) as usize;
        let first = n.min(RING_BYTES - at);
        out.reserve(n);
        // SAFETY: the ranges lie inside the ring; the bytes were published by the producer.
        // They are copied out before anyone looks at them, so a peer that rewrites them later
        // changes nothing we decode.
        unsafe {
            let dst = out.as_mut_ptr().add(out.len());
            std::ptr::copy_nonoverlapping(self.ring.data.add(at), dst, first);
            std::ptr::copy_nonoverlapping(self.ring.data, dst.add(first), n - first);
            out.set_len(out.len() + n);
        }
        self.head += n as u64;
        self.ring.head.store(self.head, Ordering::Release);
        Ok(n)
    }
}

/// One side of the bridge: a ring to write, a ring to read, the sleep states, the futex words
/// and the CPUs. Everything here the peer can write is only a hint to this side: at worst it
/// spins or yields a little longer (each bounded per wait), wakes up for nothing, or (the host)
/// moves to another CPU, at most every few milliseconds.
pub(crate) struct End<'a> {
    pub out: Producer<'a>,
    pub inp: Consumer<'a>,
    me_sleeping: &'a AtomicU32,
    peer_sleeping: &'a AtomicU32,
    my_bell: &'a AtomicU32,
    peer_bell: &'a AtomicU32,
    my_cpu: &'a AtomicU32,
    peer_cpu: &'a AtomicU32,
}

impl End<'_> {
    /// Our write and read positions, to resume from later.
    pub fn positions(&self) -> (u64, u64) {
        (self.out.tail, self.inp.head)
    }

    /// The current value of our futex word: read it before [`End::going_to_sleep`], then wait
    /// on it with [`End::wait`].
    pub fn bell(&self) -> u32 {
        self.my_bell.load(Ordering::SeqCst)
    }

    /// Announces that this side is about to sleep (`ON_FUTEX` or `ON_SOCKET`). The caller must
    /// check for work once more afterwards and call [`End::awake`] if there is some.
    pub fn going_to_sleep(&self, how: u32) {
        self.me_sleeping.store(how, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }
    /// Back from sleep (or from deciding not to): publishes the CPU this side now runs on at
    /// once, so that a peer deciding whether to spin does not go by the CPU it slept on.
    pub fn awake(&self) {
        self.note_cpu();
        self.me_sleeping.store(AWAKE, Ordering::SeqCst);
    }

    /// Wakes the peer if it sleeps on its futex word. Returns true when it sleeps on the socket
    /// instead: the caller rings that.
    pub fn wake_peer(&self) -> bool {
        fence(Ordering::SeqCst);
        if self.peer_sleeping.load(Ordering::SeqCst) == AWAKE {
            return false;
        }
        match self.peer_sleeping.swap(AWAKE, Ordering::SeqCst) {
            ON_FUTEX => {
                self.peer_bell.fetch_add(1, Ordering::SeqCst);
                futex_wake(self.peer_bell);
                false
            }
            ON_SOCKET => true,
            _ => false,
        }
    }

    /// Sleeps on our futex word while it still holds `seen`, for at most `timeout`.
    pub fn wait(&self, seen: u32, timeout: Duration) {
        futex_wait(self.my_bell, seen, timeout);
    }

    /// Publishes the CPU this side runs on.
    pub fn note_cpu(&self) {
        self.my_cpu.store(current_cpu(), Ordering::Relaxed);
    }

    /// Whether spinning can pay off: the peer is awake and not on our CPU.
    pub fn peer_runs_elsewhere(&self) -> bool {
        self.peer_sleeping.load(Ordering::Relaxed) == AWAKE
            && self.peer_cpu.load(Ordering::Relaxed) != self.my_cpu.load(Ordering::Relaxed)
    }

    /// The CPU this side last published.
    pub fn my_cpu(&self) -> u32 {
        self.my_cpu.load(Ordering::Relaxed)
    }

    /// Whether the peer is awake on our CPU: it can run only when we give the CPU up.
    pub fn peer_shares_cpu(&self) -> bool {
        self.peer_sleeping.load(Ordering::Relaxed) == AWAKE
            && self.peer_cpu.load(Ordering::Relaxed) == self.my_cpu.load(Ordering::Relaxed)
    }
}

/// Hands the CPU to the peer when both share one, without sleeping.
///
/// Sleeping on the futex there costs two system calls and a context switch per hand-over, and
/// keeps the pair on one CPU for good: only one of them is ever runnable, so the load balancer
/// never moves one to another CPU. `sched_yield` switches straight to the peer and leaves both
/// runnable, so an idle CPU pulls one of them over, and from then on both spin. It is bounded
/// (`BUDGET`), and it stops for a while (`BACKOFF`) after a yield that let another process run
/// long (`SLOW`): on a CPU shared with other work, a yield may give that work a whole time
/// slice, which costs more than a sleep.
pub(crate) struct Yielder {
    off_until: Option<Instant>,
}

impl Yielder {
    const BUDGET: Duration = Duration::from_micros(50);
    const SLOW: Duration = Duration::from_micros(30);
    const BACKOFF: Duration = Duration::from_millis(50);

    pub fn new() -> Yielder {
        Yielder { off_until: None }
    }

    /// Yields while the peer shares our CPU and `ready` is false, within the budget. True when
    /// `ready` became true.
    pub fn hand_over(&mut self, end: &End<'_>, ready: impl Fn() -> bool) -> bool {
        let start = Instant::now();
        if let Some(t) = self.off_until {
            if start < t {
                return false;
            }
            self.off_until = None;
        }
        loop {
            let before = Instant::now();
            // SAFETY: no arguments, no memory touched.
            unsafe { libc::sched_yield() };
            let after = Instant::now();
            if ready() {
                return true;
            }
            if after.duration_since(before) > Self::SLOW {
                self.off_until = Some(after + Self::BACKOFF);
                return false;
            }
            end.note_cpu();
            if !end.peer_shares_cpu() || after.duration_since(start) > Self::BUDGET {
                return false;
            }
        }
    }
}

fn current_cpu() -> u32 {
    // SAFETY: no preconditions; glibc answers from the rseq area or the vDSO, without a system call.
    let cpu = unsafe { libc::sched_getcpu() };
    u32::try_from(cpu).unwrap_or(u32::MAX)
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: a shared (not private) futex on a word of the mapping both processes hold.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            1,
            std::ptr::null::<libc::timespec>(),
        )
    };
}

fn futex_wait(word: &AtomicU32, seen: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: as above; the kernel only reads `ts`. EAGAIN (the word changed), EINTR and
    // ETIMEDOUT all mean "look again", which every caller does.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            &ts as *const libc::timespec,
        )
    };
}

/// How long a waiting side spins before it sleeps, adapted to how often spinning pays off.
pub(crate) struct SpinBudget {
    nanos: u32,
}

impl SpinBudget {
    const MIN: u32 = 2_000;
    const MAX: u32 = 50_000;

    pub fn new() -> SpinBudget {
        SpinBudget { nanos: Self::MAX }
    }
    pub fn get(&self) -> Duration {
        Duration::from_nanos(u64::from(self.nanos))
    }
    /// The answer came while spinning.
    pub fn caught(&mut self) {
        self.nanos = self.nanos.saturating_mul(2).min(Self::MAX);
    }
    /// The whole budget went by without an answer.
    pub fn missed(&mut self) {
        self.nanos = (self.nanos / 2).max(Self::MIN);
    }
}

/// Reassembles frames from a consumer. Frames longer than `max` are refused from their header,
/// before anything is allocated for them.
pub(crate) struct FrameReader {
    header: Vec<u8>,
    want: Option<usize>,
    buf: Vec<u8>,
    done: bool,
}

/// Why a frame could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameError {
    #[error(transparent)]
    Corrupt(#[from] Corrupt),
    #[error("the worker sent a message of {len} bytes; the limit is {max}")]
    TooLong { len: usize, max: usize },
}

impl FrameReader {
    pub fn new() -> Self {
        FrameReader {
            header: Vec::with_capacity(4),
            want: None,
            buf: Vec::with_capacity(4096),
            done: false,
        }
    }

    /// The next whole frame's payload, if one has arrived. The slice is valid until the next call.
    pub fn next(&mut self, c: &mut Consumer<'_>, max: usize) -> Result<Option<&[u8]>, FrameError> {
        if self.done {
            self.done = false;
            self.buf.clear();
            if self.buf.capacity() > (4 << 20) {
                self.buf = Vec::with_capacity(4096);
            }
        }
        let len = match self.want {
            Some(len) => len,
            None => {
                let need = 4 - self.header.len();
                c.read_into(&mut self.header, need)?;
                if self.header.len() < 4 {
                    return Ok(None);
                }
                let h = &self.header;
                let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
                self.header.clear();
                if len > max {
                    return Err(FrameError::TooLong { len, max });
                }
                self.buf.reserve(len);
                self.want = Some(len);
                len
            }
        };
        let need = len - self.buf.len();
        if need > 0 {
            c.read_into(&mut self.buf, need)?;
        }
        if self.buf.len() < len {
            return Ok(None);
        }
        self.want = None;
        self.done = true;
        Ok(Some(&self.buf[..]))
    }
}

/// A doorbell byte: reads it all, returns false at end of file.
pub(crate) fn drain_doorbell(fd: RawFd) -> io::Result<bool> {
    let mut buf = [0u8; 64];
    loop {
        // SAFETY: reading into a local buffer.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n > 0 {
            if (n as usize) < buf.len() {
                return Ok(true);
            }
            continue;
        }
        if n == 0 {
            return Ok(false);
        }
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock => Ok(true),
            io::ErrorKind::Interrupted => continue,
            _ => Err(e),
        };
    }
}

/// Rings the doorbell. A full socket buffer means the peer has wake-ups pending already.
pub(crate) fn ring_doorbell(fd: RawFd) {
    // SAFETY: writing one byte from a local.
    unsafe {
        libc::send(
            fd,
            [1u8].as_ptr().cast(),
            1,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_stream_through_a_small_ring_in_pieces() {
        let (shm, _fd) = Shm::create().unwrap();
        let mut host = shm.host_end((0, 0));
        let mut worker = shm.worker_end();
        let big: Vec<u8> = (0..RING_BYTES * 3).map(|i| (i % 251) as u8).collect();
        let mut frame = (big.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(&big);
        let mut reader = FrameReader::new();
        let mut got = None;
        let mut rest = &frame[..];
        while got.is_none() {
            let n = worker.out.write_some(rest).unwrap();
            rest = &rest[n..];
            if let Some(p) = reader.next(&mut host.inp, usize::MAX).unwrap() {
                got = Some(p.to_vec());
            }
        }
        assert_eq!(got.unwrap(), big);
        assert!(rest.is_empty());
    }

    #[test]
    fn an_oversized_frame_is_refused_from_its_header() {
        let (shm, _fd) = Shm::create().unwrap();
        let host = shm.host_end((0, 0));
        let mut worker = shm.worker_end();
        worker.out.write_some(&(1u32 << 30).to_le_bytes()).unwrap();
        let mut host_in = host.inp;
        let e = FrameReader::new().next(&mut host_in, 64 << 20).unwrap_err();
        assert!(matches!(e, FrameError::TooLong { .. }));
    }

    #[test]
    fn impossible_positions_are_corruption() {
        let (shm, _fd) = Shm::create().unwrap();
        let mut host = shm.host_end((0, 0));
        shm.word64(OFF_TO_HOST_TAIL)
            .store(u64::MAX, Ordering::SeqCst);
        assert!(host.inp.available().is_err());
        shm.word64(OFF_TO_WORKER_HEAD)
            .store(12345, Ordering::SeqCst);
        assert!(host.out.write_some(b"x").is_err());
    }
}
