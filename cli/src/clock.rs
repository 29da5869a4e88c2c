//! `leaselock clock`: this host's clock against the store's, measured from the `Date` header
//! of a dozen answers, each request timed to narrow the estimate most (about a second each).

use leaselock::{Estimate, LeaseTable};

use crate::{other, CliResult, Failure, TableArgs};

#[derive(clap::Args, Debug, Clone)]
pub struct ClockArgs {
    /// How many requests to measure with (DescribeTable: no capacity used).
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub answers: u32,
    /// Print the measurement as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Measures and prints; fails (exit 1) when this host's clock is off the store's by more than
/// half the clock skew: leases then still run on the store's clock, but the host's time
/// synchronisation needs fixing.
pub async fn run(args: &TableArgs, c: &ClockArgs) -> CliResult {
    let table = LeaseTable::connect(args.config()?).await?;
    let mut round_trip_ms = 10;
    let mut answered = 0;
    for _ in 0..c.answers {
        if let Some(rt) = table.probe_clock(round_trip_ms).await {
            round_trip_ms = rt;
            answered += 1;
        }
    }
    let estimate = table.store_clock().and_then(|clock| clock.estimate());
    let Some(e) = estimate.filter(|_| answered > 0) else {
        return Err(other(format!("no answer of table {} measured the store's clock", args.table_name)));
    };
    if c.json {
        let doc = serde_json::json!({
            "offset_ms": e.offset_ms,
            "uncertainty_ms": e.uncertainty_ms,
            "answers": e.samples,
            "round_trip_ms": round_trip_ms,
        });
        println!("{doc}");
    } else {
        println!("{}", describe(Some(e)));
    }
    let limit = args.skew_ms / 2;
    if e.offset_ms.unsigned_abs() > limit {
        return Err(Failure::Other(format!(
            "this host's clock is off the store's by more than half the clock skew ({limit} ms): \
             leases run on the store's clock, but fix the host's time synchronisation"
        )));
    }
    Ok(())
}

/// One line: how this host's clock stands against the store's.
pub fn describe(estimate: Option<Estimate>) -> String {
    let Some(e) = estimate else { return "clock: the store's clock is not measured yet".to_string() };
    let side = match e.offset_ms {
        o if o.unsigned_abs() <= e.uncertainty_ms => "agrees with".to_string(),
        o if o > 0 => format!("is {o} ms behind"),
        o => format!("is {} ms ahead of", -o),
    };
    format!(
        "clock: this host's clock {side} the store's (offset {:+} ms ± {} ms, {} answers)",
        e.offset_ms, e.uncertainty_ms, e.samples
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_which_way_the_host_is_off() {
        let e = |offset_ms| Some(Estimate { offset_ms, uncertainty_ms: 4, samples: 24 });
        assert_eq!(
            describe(e(5_003)),
            "clock: this host's clock is 5003 ms behind the store's (offset +5003 ms ± 4 ms, 24 answers)"
        );
        assert_eq!(
            describe(e(-2_001)),
            "clock: this host's clock is 2001 ms ahead of the store's (offset -2001 ms ± 4 ms, 24 answers)"
        );
        assert!(describe(e(0)).contains("agrees with"));
        assert_eq!(
            describe(e(-3)),
            "clock: this host's clock agrees with the store's (offset -3 ms ± 4 ms, 24 answers)"
        );
        assert_eq!(describe(None), "clock: the store's clock is not measured yet");
    }
}
