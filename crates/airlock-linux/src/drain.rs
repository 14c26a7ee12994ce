//! The run's output pipes (stdout, stderr, the driver's report), read by
//! the supervisor in bounded steps, so that no amount of output can hold
//! off the clock the supervisor keeps in the same loop.
//!
//! One step is one system call: up to the cap, one read of at most
//! [`CHUNK`] bytes; past it, one splice of whatever the pipe holds into
//! `/dev/null` (no copy), and then the stream rests for [`DISCARD_REST`].
//! Below the cap the work is bounded by the cap itself; past it, by the
//! rest: at most 1,000 steps a second per stream, however many processes
//! write and however cheaply (tee(2) costs the writer nothing). A writer
//! faster than that waits on a full pipe; its bytes were being dropped
//! anyway.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use airlock_core::output::{CappedBuffer, Captured};
use rustix::pipe::SpliceFlags;

/// The most one read takes.
pub const CHUNK: usize = 64 * 1024;
/// The most one discard takes: the largest pipe an unprivileged process can
/// make (`/proc/sys/fs/pipe-max-size` by default).
const DISCARD_CHUNK: usize = 1 << 20;
/// How long a stream past its cap rests after each discard.
pub const DISCARD_REST: Duration = Duration::from_millis(1);
/// The most steps the last drain, after every writer is gone, takes: what a
/// pipe holds then is at most a pipe's worth.
const FINAL_STEPS: usize = 64;

/// One output pipe, our non-blocking read end.
#[derive(Debug)]
pub struct Stream {
    fd: OwnedFd,
    buffer: CappedBuffer,
    open: bool,
    /// Past the cap: no step before this.
    resting_until: Option<Instant>,
}

impl Stream {
    /// `fd` must be non-blocking.
    pub fn new(fd: OwnedFd, cap: u64) -> Stream {
        Stream { fd, buffer: CappedBuffer::new(cap), open: true, resting_until: None }
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Whether to poll it now.
    pub fn wants_poll(&self, now: Instant) -> bool {
        self.open && self.resting_until.is_none_or(|until| now >= until)
    }

    /// When a resting stream may be polled again.
    pub fn wake_at(&self) -> Option<Instant> {
        self.resting_until.filter(|_| self.open)
    }

    pub fn is_over(&self) -> bool {
        self.buffer.is_over()
    }

    /// One bounded step on a readable pipe.
    pub fn step(&mut self, null: &OwnedFd, now: Instant) {
        if !self.buffer.is_over() {
            self.read_once();
            return;
        }
        match rustix::pipe::splice(&self.fd, None, null, None, DISCARD_CHUNK, SpliceFlags::NONBLOCK) {
            Ok(0) => self.open = false,
            Ok(n) => self.buffer.skip(n as u64),
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
            // A pipe that cannot be spliced: read it (and drop what is read).
            Err(_) => self.read_once(),
        }
        self.resting_until = Some(now + DISCARD_REST);
    }

    fn read_once(&mut self) {
        let mut buf = [0u8; CHUNK];
        match rustix::io::read(&self.fd, &mut buf) {
            Ok(0) => self.open = false,
            Ok(n) => {
                self.buffer.push(&buf[..n]);
            }
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
            Err(_) => self.open = false,
        }
    }

    /// Once every writer is gone: what the pipe still holds, in a bounded
    /// number of steps (a writer that somehow lived on cannot hold it).
    pub fn drain_rest(&mut self, null: &OwnedFd) {
        for _ in 0..FINAL_STEPS {
            if !self.open {
                return;
            }
            let before = self.buffer.total();
            self.resting_until = None;
            self.step(null, Instant::now());
            if self.buffer.total() == before {
                return;
            }
        }
    }

    pub fn finish(self) -> Captured {
        self.buffer.finish()
    }
}
