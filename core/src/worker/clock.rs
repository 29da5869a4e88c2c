//! A clock that follows tokio's time, so a worker on a `MemoryStore` can run under tokio's
//! paused test time: timers and lease expiry then move together, deterministically.

use crate::Clock;

/// Wall and monotonic time measured from tokio's `Instant` (paused or not) since creation.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: tokio::time::Instant,
    wall_at_origin_ms: u64,
}

impl TokioClock {
    /// A clock whose wall time reads `wall_at_origin_ms` now.
    pub fn new(wall_at_origin_ms: u64) -> Self {
        Self { origin: tokio::time::Instant::now(), wall_at_origin_ms }
    }

    fn elapsed_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        self.wall_at_origin_ms + self.elapsed_ms()
    }

    fn monotonic_ms(&self) -> u64 {
        self.elapsed_ms()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn follows_paused_time() {
        let clock = TokioClock::new(1_000);
        tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
        assert_eq!((clock.now_ms(), clock.monotonic_ms()), (3_500, 2_500));
    }
}
