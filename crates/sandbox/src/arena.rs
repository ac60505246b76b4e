//! The memory of one VM: a single reserved mapping that holds the allocator's own state and every
//! byte QuickJS allocates, so that the whole VM, runtime and context included, is one contiguous
//! image.
//!
//! That is what makes preparation cheap. Building a locked-down VM (intrinsics, prelude, every
//! reachable built-in frozen) costs about a millisecond; copying its image (about 0.5 MB) costs
//! well under a tenth of that. So a VM is built once, its image is saved, and after each script the image is
//! copied back over the mapping and everything the script grew beyond it is returned to the
//! kernel. The next script starts from byte-for-byte the same state as the first: no object,
//! atom, shape, job or registry entry of one script survives into the next, because they all
//! lived in memory that was overwritten or discarded.
//!
//! The allocator is TLSF (`rlsf`): constant-time, with its free lists inside the mapping, and a
//! pool that grows at its end, so the saved image is a prefix of the mapping.
//!
//! Pages a script touched past the image are zeroed in place rather than handed back, up to
//! [`WARM_BYTES`]: a page handed back costs the next script a fault and the kernel a fresh
//! clear, which on a result of a few megabytes was a third of the script's time. Zeroed, they
//! read exactly as fresh pages would, so nothing of one script reaches the next either way.

use std::alloc::Layout;
use std::cell::{Cell, RefCell};
use std::ptr::NonNull;

type Tlsf = rlsf::Tlsf<'static, u64, u16, 60, 16>;

/// Every allocation is aligned like `malloc`'s.
const ALIGN: usize = 16;
/// Where the pool starts: after the allocator's state, page-aligned.
const POOL_OFFSET: usize = (std::mem::size_of::<Tlsf>() + 4095) & !4095;
/// The pool grows by at least this much at a time.
const GROW_STEP: usize = 1 << 20;
const PAGE: usize = 4096;
/// Bytes of a free block's header in the allocator (size, previous block, free-list links),
/// rounded up.
const FREE_HEADER: usize = 2 * rlsf::GRANULARITY;
/// Resident pages a restore zeroes and keeps, at most; the rest go back to the kernel. It bounds
/// what an idle VM holds after a large script.
pub(crate) const WARM_BYTES: usize = 16 << 20;

/// A reserved mapping and the TLSF pool inside it.
pub(crate) struct Arena {
    base: NonNull<u8>,
    reserved: usize,
    /// Offset of the end of the pool: memory past it has never been handed to the allocator.
    end: Cell<usize>,
    /// The saved image: the mapping's first `image.len()` bytes, up to the header of the free
    /// block at the end of the pool (whose contents do not matter)...
    image: RefCell<Vec<u8>>,
    /// ...and the pool's last page, which holds its end marker.
    image_tail: RefCell<Vec<u8>>,
    /// The pool's end when the image was saved.
    image_end: Cell<usize>,
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: the mapping was created by `reserve` with this size.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.reserved) };
    }
}

#[derive(Debug, thiserror::Error)]
#[error("could not reserve {0} MiB of address space for the VM: {1}")]
pub(crate) struct ReserveError(usize, std::io::Error);

impl Arena {
    /// Reserves `bytes` of address space (no memory is committed until touched) and starts the
    /// pool.
    pub fn reserve(bytes: usize) -> Result<Arena, ReserveError> {
        let reserved = bytes
            .max(POOL_OFFSET + 2 * GROW_STEP)
            .next_multiple_of(PAGE);
        // SAFETY: an anonymous private mapping; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserved,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(ReserveError(
                reserved >> 20,
                std::io::Error::last_os_error(),
            ));
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| {
            ReserveError(reserved >> 20, std::io::Error::other("mmap returned null"))
        })?;
        let arena = Arena {
            base,
            reserved,
            end: Cell::new(POOL_OFFSET),
            image: RefCell::new(Vec::new()),
            image_tail: RefCell::new(Vec::new()),
            image_end: Cell::new(0),
        };
        // SAFETY: the state lives at the start of the mapping, which is ours and large enough.
        unsafe {
            base.as_ptr().cast::<Tlsf>().write(Tlsf::new());
            let first = slice(base.as_ptr().add(POOL_OFFSET), GROW_STEP);
            if arena.tlsf().insert_free_block_ptr(first).is_none() {
                return Err(ReserveError(
                    reserved >> 20,
                    std::io::Error::other("the first pool could not be set up"),
                ));
            }
        }
        arena.end.set(POOL_OFFSET + GROW_STEP);
        Ok(arena)
    }

    #[allow(clippy::mut_from_ref)]
    fn tlsf(&self) -> &mut Tlsf {
        // SAFETY: the state was written by `reserve`; a VM is used by one thread, and none of
        // the methods below hand out a reference that outlives the call.
        unsafe { &mut *self.base.as_ptr().cast::<Tlsf>() }
    }

    /// Adds at least `need` bytes at the end of the pool. False when the reservation is used up.
    fn grow(&self, need: usize) -> bool {
        let end = self.end.get();
        let room = self.reserved - end;
        let want = need
            .saturating_add(GROW_STEP)
            .max((end - POOL_OFFSET) / 2)
            .next_multiple_of(PAGE)
            .min(room);
        if want < need.saturating_add(64) {
            return false;
        }
        // SAFETY: [end, end + want) lies inside the mapping and directly follows the pool.
        let added = unsafe {
            self.tlsf()
                .append_free_block_ptr(slice(self.base.as_ptr().add(end), want))
        };
        self.end.set(end + added);
        added > 0
    }

    pub fn alloc(&self, size: usize) -> *mut u8 {
        let Ok(layout) = Layout::from_size_align(size.max(1), ALIGN) else {
            return std::ptr::null_mut();
        };
        loop {
            if let Some(p) = self.tlsf().allocate(layout) {
                return p.as_ptr();
            }
            if !self.grow(size) {
                return std::ptr::null_mut();
            }
        }
    }

    /// # Safety
    /// `ptr` came from this arena and was not freed.
    pub unsafe fn free(&self, ptr: *mut u8) {
        if let Some(p) = NonNull::new(ptr) {
            // SAFETY: per the contract.
            unsafe { self.tlsf().deallocate(p, ALIGN) };
        }
    }

    /// # Safety
    /// `ptr` came from this arena and was not freed. On failure it is left as it was.
    pub unsafe fn realloc(&self, ptr: *mut u8, size: usize) -> *mut u8 {
        let Some(p) = NonNull::new(ptr) else {
            return self.alloc(size);
        };
        let Ok(layout) = Layout::from_size_align(size.max(1), ALIGN) else {
            return std::ptr::null_mut();
        };
        loop {
            // SAFETY: per the contract; same alignment as every allocation here.
            if let Some(n) = unsafe { self.tlsf().reallocate(p, layout) } {
                return n.as_ptr();
            }
            if !self.grow(size) {
                return std::ptr::null_mut();
            }
        }
    }

    /// # Safety
    /// `ptr` came from an arena and was not freed.
    pub unsafe fn usable_size(ptr: *mut u8) -> usize {
        match NonNull::new(ptr) {
            // SAFETY: per the contract.
            Some(p) => unsafe { Tlsf::allocation_usable_size(p) },
            None => 0,
        }
    }

    /// Saves the current state as the image every later [`Arena::restore`] returns to.
    pub fn save(&self) {
        let end = self.end.get();
        let base = self.base.as_ptr();
        // Where the last allocated block ends: past it, the pool is one free block whose header
        // is all that matters, then the end marker.
        let mut used_end = POOL_OFFSET;
        // SAFETY: [POOL_OFFSET, end) is exactly the pool this allocator manages.
        unsafe {
            let pool = slice(base.add(POOL_OFFSET), end - POOL_OFFSET);
            for b in self.tlsf().iter_blocks(pool) {
                let range = b.as_ptr();
                let start = range.as_ptr() as *mut u8 as usize - base as usize;
                used_end = if b.is_occupied() {
                    start + range.len()
                } else {
                    start + FREE_HEADER
                };
            }
        }
        let head = used_end.next_multiple_of(ALIGN).min(end);
        let tail_from = (end - PAGE).max(head);
        // SAFETY: both ranges are inside the mapping and initialised (written by the allocator
        // or zero pages from the kernel).
        unsafe {
            let mut image = self.image.borrow_mut();
            image.clear();
            image.extend_from_slice(std::slice::from_raw_parts(base, head));
            let mut tail = self.image_tail.borrow_mut();
            tail.clear();
            tail.extend_from_slice(std::slice::from_raw_parts(
                base.add(tail_from),
                end - tail_from,
            ));
        }
        self.image_end.set(end);
    }

    /// Puts the mapping back to the saved image and makes every other byte the script touched
    /// read as zero (see [`clear_pages`]). Nothing may refer into the mapping from outside across this call
    /// except what already did when the image was saved.
    pub fn restore(&self) {
        let image = self.image.borrow();
        let tail = self.image_tail.borrow();
        let saved_end = self.image_end.get();
        if saved_end == 0 {
            return;
        }
        let head = image.len();
        let tail_from = saved_end - tail.len();
        let base = self.base.as_ptr();
        // SAFETY: the ranges were saved from this mapping, which still holds them.
        unsafe {
            std::ptr::copy_nonoverlapping(image.as_ptr(), base, head);
            std::ptr::copy_nonoverlapping(tail.as_ptr(), base.add(tail_from), tail.len());
        }
        // The rest of the image's last page: inside the free block, so no allocator state, but
        // it may hold the last script's bytes.
        let head_page_end = head.next_multiple_of(PAGE).min(tail_from);
        // SAFETY: inside the mapping, between the image and its tail.
        unsafe { base.add(head).write_bytes(0, head_page_end - head) };
        let mut warm = WARM_BYTES;
        let mut resident = Vec::new();
        let mut clear = |from: usize, to: usize| {
            let from = from.next_multiple_of(PAGE);
            let to = to - to % PAGE;
            if to > from {
                // SAFETY: a range of our own private mapping, which nothing refers into.
                unsafe { clear_pages(base.add(from), to - from, &mut warm, &mut resident) };
            }
        };
        clear(head, tail_from);
        let end = self.end.get();
        if end > saved_end {
            clear(saved_end, end);
        }
        self.end.set(saved_end);
    }

    /// Bytes a restore copies.
    pub fn image_bytes(&self) -> usize {
        self.image.borrow().len() + self.image_tail.borrow().len()
    }
}

/// Makes `len` bytes at page-aligned `p` read as zeros: resident pages are zeroed in place while
/// `warm` lasts; every other page (resident past it, or not resident, which may mean swapped
/// out and still holding data) is handed back with `MADV_DONTNEED`.
///
/// # Safety
/// `[p, p + len)` is a page-aligned range of a private anonymous mapping nothing refers into.
unsafe fn clear_pages(p: *mut u8, len: usize, warm: &mut usize, resident: &mut Vec<u8>) {
    let pages = len / PAGE;
    resident.clear();
    resident.resize(pages, 0);
    // SAFETY: the range is mapped and `resident` has a byte per page.
    let known = unsafe { libc::mincore(p.cast(), len, resident.as_mut_ptr()) } == 0;
    let mut i = 0;
    while i < pages {
        let here = known && resident[i] & 1 == 1;
        let mut j = i + 1;
        while j < pages && (known && resident[j] & 1 == 1) == here {
            j += 1;
        }
        let (from, bytes) = (i * PAGE, (j - i) * PAGE);
        if here && *warm >= bytes {
            *warm -= bytes;
            // SAFETY: inside the range the caller vouches for.
            unsafe { p.add(from).write_bytes(0, bytes) };
        } else {
            // SAFETY: as above; the pages read as zeros afterwards.
            unsafe { libc::madvise(p.add(from).cast(), bytes, libc::MADV_DONTNEED) };
        }
        i = j;
    }
}

fn slice(p: *mut u8, len: usize) -> NonNull<[u8]> {
    // SAFETY: callers pass pointers into the mapping, never null.
    unsafe { NonNull::new_unchecked(std::ptr::slice_from_raw_parts_mut(p, len)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_arena_is_the_saved_image_and_can_grow_again() {
        let a = Arena::reserve(64 << 20).unwrap();
        let kept = a.alloc(100);
        unsafe { kept.write_bytes(7, 100) };
        a.save();
        for round in 0..3 {
            // Grow well past the first pool, write, then go back.
            let big = a.alloc(20 << 20);
            assert!(!big.is_null(), "round {round}");
            unsafe { big.write_bytes(1, 20 << 20) };
            unsafe { kept.write_bytes(9, 100) };
            a.restore();
            assert_eq!(unsafe { *kept.add(99) }, 7);
        }
        // The reservation bounds what can be allocated.
        assert!(a.alloc(80 << 20).is_null());
        unsafe { a.free(kept) };
    }

    #[test]
    fn a_restore_leaves_nothing_of_the_script_past_the_image_warm_or_not() {
        let a = Arena::reserve(96 << 20).unwrap();
        let kept = a.alloc(64);
        a.save();
        // More than WARM_BYTES, so some pages are zeroed in place and the rest handed back.
        let n = WARM_BYTES + (8 << 20);
        for _ in 0..2 {
            let big = a.alloc(n);
            assert!(!big.is_null());
            unsafe { big.write_bytes(0xAB, n) };
            a.restore();
            let head = a.image.borrow().len();
            let tail_from = a.image_end.get() - a.image_tail.borrow().len();
            let start = big as usize - a.base.as_ptr() as usize;
            for off in start..start + n {
                if off < head || (tail_from..a.image_end.get()).contains(&off) {
                    continue; // the saved image, copied back
                }
                let b = unsafe { *a.base.as_ptr().add(off) };
                assert_eq!(
                    b, 0,
                    "a byte of the last script survived a restore at {off}"
                );
            }
        }
        unsafe { a.free(kept) };
    }

    #[test]
    fn restoring_without_a_saved_image_is_harmless() {
        let a = Arena::reserve(8 << 20).unwrap();
        a.restore();
        assert!(!a.alloc(1024).is_null());
    }
}
