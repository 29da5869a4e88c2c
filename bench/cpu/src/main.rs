//! Process CPU time per renew and per acquire of the Rust `LeaseTable`, against the endpoint in
//! `AWS_ENDPOINT_URL` (make bench points it at a keep-alive server answering canned responses).
//! Prints one JSON object: `rust_cpu_us_per_renew`, `rust_cpu_us_per_acquire`.
//!
//! usage: leaselock-bench-cpu OPS

use std::time::Duration;

use leaselock::{LeaseStore, LeaseTable, TableConfig};

/// User + system CPU of the whole process so far, microseconds.
fn cpu_us() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(usage.ru_utime) + us(usage.ru_stime)
}

#[tokio::main]
async fn main() -> leaselock::Result<()> {
    let ops: usize = std::env::args().nth(1).and_then(|n| n.parse().ok()).unwrap_or(3_000);
    let config =
        TableConfig::new("bench").lease_duration(Duration::from_secs(20)).renew_interval(Duration::from_secs(5));
    let table = LeaseTable::connect(config).await?;
    let mut lease = table.acquire("bench", "bench-owner").await?;
    for _ in 0..ops / 10 {
        table.renew(&mut lease).await?;
    }
    let start = cpu_us();
    for _ in 0..ops {
        table.renew(&mut lease).await?;
    }
    let renew = (cpu_us() - start) / ops as f64;
    for _ in 0..ops / 10 {
        table.acquire("bench", "bench-owner").await?;
    }
    let start = cpu_us();
    for _ in 0..ops {
        table.acquire("bench", "bench-owner").await?;
    }
    let acquire = (cpu_us() - start) / ops as f64;
    println!("{{\"rust_cpu_us_per_renew\": {renew:.1}, \"rust_cpu_us_per_acquire\": {acquire:.1}}}");
    Ok(())
}
