//! Two clocks: the wall clock that expiry times are written in, and a monotonic clock that an
//! owner measures its own deadline on (wall-clock jumps must never extend a lease).

use std::sync::atomic::{AtomicU64, Ordering};

pub use crate::store_clock::StoreOffset;

pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Wall-clock time, epoch milliseconds.
    fn now_ms(&self) -> u64;
    /// Monotonic milliseconds from an arbitrary origin; never goes backwards.
    fn monotonic_ms(&self) -> u64;
    /// How this clock's wall time stands against the store's clock: by default it is the
    /// store's own reckoning ([`StoreOffset::Exact`]); a [`crate::store_clock::StoreClock`]
    /// measures it.
    fn store_offset(&self) -> StoreOffset {
        StoreOffset::Exact
    }
}

/// The system clocks.
#[cfg(not(target_arch = "wasm32"))]
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

#[cfg(not(target_arch = "wasm32"))]
fn origin() -> std::time::Instant {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(std::time::Instant::now)
}

#[cfg(not(target_arch = "wasm32"))]
impl SystemClock {
    /// The `Instant` a monotonic reading stands for.
    pub fn instant_at(monotonic_ms: u64) -> std::time::Instant {
        origin() + std::time::Duration::from_millis(monotonic_ms)
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
    }

    fn monotonic_ms(&self) -> u64 {
        origin().elapsed().as_millis() as u64
    }
}

/// A clock moved by hand, for tests and simulations; a [`SkewedClock`] over it lets one
/// simulated worker's wall clock run ahead of (or behind) another's while both share the same
/// true time.
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicU64,
    mono: AtomicU64,
}

impl ManualClock {
    pub fn new(now_ms: u64) -> Self {
        Self { now: AtomicU64::new(now_ms), mono: AtomicU64::new(0) }
    }

    /// Moves both clocks forward.
    pub fn advance(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
        self.mono.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the wall clock alone (a clock jump); the monotonic clock does not follow.
    pub fn set_wall(&self, now_ms: u64) {
        self.now.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    fn monotonic_ms(&self) -> u64 {
        self.mono.load(Ordering::SeqCst)
    }
}

/// Another clock seen with a fixed wall-clock offset (a worker whose clock is off by `offset_ms`).
#[derive(Debug)]
pub struct SkewedClock<C> {
    pub inner: C,
    pub offset_ms: i64,
}

impl<C: Clock> Clock for SkewedClock<C> {
    fn now_ms(&self) -> u64 {
        self.inner.now_ms().saturating_add_signed(self.offset_ms)
    }

    fn monotonic_ms(&self) -> u64 {
        self.inner.monotonic_ms()
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }

    fn monotonic_ms(&self) -> u64 {
        (**self).monotonic_ms()
    }

    fn store_offset(&self) -> StoreOffset {
        (**self).store_offset()
    }
}
