//! Python's object arenas in 2 MiB-aligned chunks, for a warm driver
//! (docs/design.md, "Warm starts"; driver.py, `_align_arenas`).
//!
//! A pooled run ends when its process exits, and the kernel frees a
//! process's memory one page table entry at a time: a huge page at once.
//! The warm driver collapses the preload's dense memory into huge pages, but
//! a huge page maps 2 MiB at a 2 MiB boundary, within one mapping. CPython
//! takes its small objects' memory from 1 MiB arenas, each its own `mmap`,
//! and importing numpy, pandas and matplotlib maps the arenas between the
//! libraries it loads: about 20 MB of arenas that no collapse can reach, a
//! third of what the run's exit frees (driver.py measures it). Installed
//! before the preload, this allocator hands out arenas from chunks that are
//! aligned to 2 MiB, one mapping each, so that arenas lie side by side and
//! each pair of full ones can be collapsed.
//!
//! It changes where arenas are, not how CPython uses them: an arena of this
//! allocator is fresh zeroed memory as `mmap` gives, and a freed one's pages
//! are given back to the kernel at once (`MADV_DONTNEED`; the arena stays
//! mapped, to be handed out again). A request it cannot serve (another
//! size, a chunk the kernel refuses, every chunk slot used) goes to the
//! allocator it replaced, and so does the freeing of every arena that
//! allocator made. Chunks are never unmapped, so an address within one is
//! always this allocator's.
//!
//! CPython calls both functions with its interpreter lock held; the lock
//! here keeps that an assumption this file does not rely on. A fork taken
//! while another thread held it would leave the child's lock held by no
//! one, its first arena waiting forever (per-interpreter locks, 3.12's
//! subinterpreters, would allow that): so the lock is
//! taken across every fork by at-fork handlers, and released on both sides.

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::ops::{Deref, DerefMut};
use std::os::raw::c_int;
use std::ptr::{NonNull, null_mut};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::mm::{Advice, MapFlags, ProtFlags, madvise, mmap_anonymous, munmap};

/// What a 2 MiB huge page maps.
const HUGE_PAGE: usize = 2 << 20;
/// One chunk: four huge pages, room for eight of CPython's 1 MiB arenas.
/// Small, so that a process under an address-space limit (a sandbox
/// without cgroups) is charged little for the arenas not yet handed out.
const CHUNK: usize = 4 * HUGE_PAGE;
/// How many chunks this allocator makes at most (512 MiB of arenas); past
/// that, arenas come from the allocator it replaced.
const MAX_CHUNKS: usize = 64;
/// The smallest arena it serves: CPython's are 256 KiB (3.9 and before) or
/// 1 MiB. Smaller requests (3.11's frame stacks, which take their memory
/// from the same allocator) are the replaced allocator's, and never teach
/// this one its size.
const MIN_ARENA: usize = 256 << 10;
/// Room for every arena its chunks can hold, so that a freed one is always
/// kept to hand out again: nothing inside a chunk is ever unmapped, so an
/// address in a chunk is always one of this allocator's.
const MAX_FREE: usize = MAX_CHUNKS * CHUNK / MIN_ARENA;

/// CPython's `PyObjectArenaAllocator` (Include/cpython/objimpl.h), unchanged
/// since 3.4.
#[repr(C)]
#[derive(Clone, Copy)]
struct ArenaAllocator {
    ctx: *mut c_void,
    alloc: Option<unsafe extern "C" fn(ctx: *mut c_void, size: usize) -> *mut c_void>,
    free: Option<unsafe extern "C" fn(ctx: *mut c_void, ptr: *mut c_void, size: usize)>,
}

/// The allocator this one replaced, for what it cannot serve.
#[derive(Clone, Copy)]
struct Replaced {
    ctx: *mut c_void,
    alloc: unsafe extern "C" fn(ctx: *mut c_void, size: usize) -> *mut c_void,
    free: unsafe extern "C" fn(ctx: *mut c_void, ptr: *mut c_void, size: usize),
}

/// The allocator's state. Addresses are kept as integers: nothing here is
/// dereferenced.
struct Arenas {
    replaced: Replaced,
    /// The size of CPython's arenas, learnt from its first request of at
    /// least [`MIN_ARENA`] that divides a huge page (0 until then).
    arena_size: usize,
    /// [start, start + CHUNK) of each chunk made.
    chunks: [usize; MAX_CHUNKS],
    chunk_count: usize,
    /// The next arena not yet handed out, and the end of its chunk.
    next: usize,
    end: usize,
    /// Freed arenas, given back to the kernel but still mapped, to hand out again.
    free: [usize; MAX_FREE],
    free_count: usize,
}

// SAFETY: the replaced allocator's context and functions are CPython's,
// callable from whichever thread holds its interpreter lock; the rest are
// integers.
unsafe impl Send for Arenas {}

static ARENAS: ArenaLock = ArenaLock { held: AtomicBool::new(false), arenas: UnsafeCell::new(None) };

/// The allocator's state behind a lock of one atomic, which a fork's
/// handlers can take in the parent and release in the child with nothing
/// but an atomic store (a std mutex offers no release without its guard,
/// and the child is not the thread that took it). It is held for a few
/// integer operations and the raw system calls of a new chunk or a freed
/// arena (mmap, munmap, madvise: rustix's, which take no lock of libc's),
/// never across a call into libc or Python but in `install`, before the
/// handlers are registered. Nothing may call `pthread_atfork` or `dlclose`
/// while holding it. Under CPython's interpreter lock it is never
/// contended, so it yields rather than sleeps.
struct ArenaLock {
    held: AtomicBool,
    arenas: UnsafeCell<Option<Arenas>>,
}

// SAFETY: `arenas` is reached only through a guard, which exists only
// while `held` is set by it.
unsafe impl Sync for ArenaLock {}

impl ArenaLock {
    fn lock(&self) -> ArenaGuard<'_> {
        while self.held.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::thread::yield_now();
        }
        ArenaGuard(self)
    }

    fn release(&self) {
        self.held.store(false, Ordering::Release);
    }
}

struct ArenaGuard<'a>(&'a ArenaLock);

impl Deref for ArenaGuard<'_> {
    type Target = Option<Arenas>;
    fn deref(&self) -> &Option<Arenas> {
        // SAFETY: this guard holds the lock.
        unsafe { &*self.0.arenas.get() }
    }
}

impl DerefMut for ArenaGuard<'_> {
    fn deref_mut(&mut self) -> &mut Option<Arenas> {
        // SAFETY: this guard holds the lock, and is borrowed mutably.
        unsafe { &mut *self.0.arenas.get() }
    }
}

impl Drop for ArenaGuard<'_> {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// At-fork handlers: the forking thread takes the lock before the fork (so
/// no other thread is inside the allocator while the process is copied),
/// and each side releases it after. Registered once; never unregistered,
/// since the library is never unloaded. Returns 0 or the errno (the
/// first call's, every time).
fn hold_the_lock_across_forks() -> c_int {
    extern "C" fn before_fork() {
        std::mem::forget(ARENAS.lock());
    }
    extern "C" fn after_fork() {
        ARENAS.release();
    }
    static REGISTERED: OnceLock<c_int> = OnceLock::new();
    // SAFETY: registers two functions of this library, which stays loaded.
    *REGISTERED.get_or_init(|| unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork)) })
}

/// Installs this allocator as CPython's arena allocator. Returns 0 once it
/// is in force; EEXIST if it already is; ENOSYS where the process has no
/// CPython to install it in.
pub fn install() -> c_int {
    const EEXIST: c_int = 17;
    const ENOSYS: c_int = 38;
    let mut arenas = ARENAS.lock();
    if arenas.is_some() {
        return EEXIST;
    }
    let (Some(get), Some(set)) =
        (python_function(c"PyObject_GetArenaAllocator"), python_function(c"PyObject_SetArenaAllocator"))
    else {
        return ENOSYS;
    };
    let mut current = ArenaAllocator { ctx: null_mut(), alloc: None, free: None };
    // SAFETY: both are CPython's functions of this signature, found by name
    // in this process; each reads or writes one struct of the layout above,
    // which lives across the call.
    let (get, set) = unsafe {
        type Access = unsafe extern "C" fn(*mut ArenaAllocator);
        (std::mem::transmute::<NonNull<c_void>, Access>(get), std::mem::transmute::<NonNull<c_void>, Access>(set))
    };
    // SAFETY: as above.
    unsafe { get(&mut current) };
    let (Some(alloc), Some(free)) = (current.alloc, current.free) else {
        return ENOSYS;
    };
    // Before it is in force: a fork's child must find the lock free.
    let registered = hold_the_lock_across_forks();
    if registered != 0 {
        return registered;
    }
    *arenas = Some(Arenas {
        replaced: Replaced { ctx: current.ctx, alloc, free },
        arena_size: 0,
        chunks: [0; MAX_CHUNKS],
        chunk_count: 0,
        next: 0,
        end: 0,
        free: [0; MAX_FREE],
        free_count: 0,
    });
    // Our two functions lock ARENAS: released before CPython can call them.
    drop(arenas);
    let mut ours = ArenaAllocator { ctx: null_mut(), alloc: Some(alloc_arena), free: Some(free_arena) };
    // SAFETY: as above; CPython copies the struct.
    unsafe { set(&mut ours) };
    0
}

/// A function of the process's CPython, by name (the interpreter's own
/// symbols are global in every process that runs it).
fn python_function(name: &std::ffi::CStr) -> Option<NonNull<c_void>> {
    // SAFETY: dlsym reads a NUL-terminated name and returns an address or null.
    NonNull::new(unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) })
}

unsafe extern "C" fn alloc_arena(_ctx: *mut c_void, size: usize) -> *mut c_void {
    let mut guard = ARENAS.lock();
    let Some(arenas) = guard.as_mut() else {
        return null_mut();
    };
    if let Some(address) = arenas.take(size) {
        return address as *mut c_void;
    }
    let replaced = arenas.replaced;
    drop(guard);
    // SAFETY: the replaced allocator, called as CPython calls it.
    unsafe { (replaced.alloc)(replaced.ctx, size) }
}

unsafe extern "C" fn free_arena(_ctx: *mut c_void, ptr: *mut c_void, size: usize) {
    let mut guard = ARENAS.lock();
    let Some(arenas) = guard.as_mut() else {
        return;
    };
    if arenas.give_back(ptr as usize, size) {
        return;
    }
    let replaced = arenas.replaced;
    drop(guard);
    // SAFETY: an arena the replaced allocator made, freed as CPython frees it.
    unsafe { (replaced.free)(replaced.ctx, ptr, size) }
}

impl Arenas {
    /// An arena of `size` from a chunk, if this allocator serves it.
    fn take(&mut self, size: usize) -> Option<usize> {
        if self.arena_size == 0 && size >= MIN_ARENA && HUGE_PAGE % size == 0 && size % page_size() == 0 {
            self.arena_size = size;
        }
        if size != self.arena_size || size == 0 {
            return None;
        }
        if self.free_count > 0 {
            self.free_count -= 1;
            return Some(self.free[self.free_count]);
        }
        if self.next + size > self.end {
            let chunk = self.new_chunk()?;
            (self.next, self.end) = (chunk, chunk + CHUNK);
        }
        let address = self.next;
        self.next += size;
        Some(address)
    }

    /// A fresh chunk, aligned to a huge page, mapped as one mapping.
    fn new_chunk(&mut self) -> Option<usize> {
        if self.chunk_count == MAX_CHUNKS {
            return None;
        }
        // Mapped a huge page longer than a chunk, then trimmed at both ends
        // to the aligned chunk inside.
        let length = CHUNK + HUGE_PAGE;
        // SAFETY: a fresh private anonymous mapping at an address of the
        // kernel's choice: it overlaps nothing.
        let mapped = unsafe {
            mmap_anonymous(
                null_mut(),
                length,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }
        .ok()? as usize;
        let start = (mapped + HUGE_PAGE - 1) & !(HUGE_PAGE - 1);
        let (head, tail) = (start - mapped, mapped + length - (start + CHUNK));
        // SAFETY: the two ends of the mapping just made, outside the chunk;
        // nothing else knows their addresses.
        unsafe {
            if head > 0 {
                let _ = munmap(mapped as *mut c_void, head);
            }
            if tail > 0 {
                let _ = munmap((start + CHUNK) as *mut c_void, tail);
            }
        }
        self.chunks[self.chunk_count] = start;
        self.chunk_count += 1;
        Some(start)
    }

    /// Takes back an arena of this allocator's; false if it is not one.
    fn give_back(&mut self, address: usize, size: usize) -> bool {
        let ours = size == self.arena_size
            && self.chunks[..self.chunk_count].iter().any(|&chunk| (chunk..chunk + CHUNK).contains(&address));
        if !ours {
            return false;
        }
        // SAFETY: an arena of ours that CPython has freed: nothing points
        // into it any more. MADV_DONTNEED gives its pages back and leaves
        // it mapped, reading as zeros, as a fresh arena must.
        let cleared = unsafe { madvise(address as *mut c_void, size, Advice::LinuxDontNeed) }.is_ok();
        // (The list has room for every arena of every chunk. An arena the
        // kernel would not clear, which it has no reason to refuse, stays
        // mapped and is never handed out again.)
        if cleared && self.free_count < MAX_FREE {
            self.free[self.free_count] = address;
            self.free_count += 1;
        }
        true
    }
}

fn page_size() -> usize {
    rustix::param::page_size()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Another thread holds the allocator's lock when this one forks: the
    /// fork waits for it, and the child finds the lock free (without the
    /// handlers the child's lock stays held by a thread it does not have,
    /// and its first arena would wait forever: here, until its alarm).
    #[test]
    fn a_fork_while_another_thread_holds_the_lock_leaves_the_child_a_free_lock() {
        assert_eq!(hold_the_lock_across_forks(), 0);
        let (held, holding) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            let guard = ARENAS.lock();
            held.send(()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(guard);
        });
        holding.recv().unwrap();
        // SAFETY: the child uses atomics, alarm and _exit only, all
        // async-signal-safe, so forking this multi-threaded test is sound.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as above.
            unsafe { libc::alarm(5) };
            drop(ARENAS.lock());
            // SAFETY: as above.
            unsafe { libc::_exit(0) };
        }
        assert!(pid > 0, "fork failed");
        let mut status = 0;
        // SAFETY: waits for the child just forked, writing into `status`.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        holder.join().unwrap();
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child could not take the lock (status {status:#x}: killed by its alarm if {})",
            libc::SIGALRM
        );
    }
}
