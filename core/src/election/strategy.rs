//! Which registered candidate a strategic election picks: plain functions of the candidate list.

use super::Candidate;

/// How a strategic election chooses its leader among the live candidates.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Strategy {
    /// The highest score; ties go to the smallest id.
    HighestScore,
    /// This candidate while it is registered; otherwise the highest score.
    PreferredNode(String),
    /// The lowest load; ties go to the smallest id.
    LeastLoaded,
}

impl Strategy {
    /// Checks a preferred candidate's id (the id rule), naming the `strategy` option.
    pub fn validate(&self) -> crate::Result<()> {
        match self {
            Strategy::PreferredNode(id) => crate::config::validate_id("strategy", id),
            Strategy::HighestScore | Strategy::LeastLoaded => Ok(()),
        }
    }

    /// The id of the candidate this strategy picks, `None` when there is none.
    pub fn pick<'a>(&self, candidates: &'a [Candidate]) -> Option<&'a str> {
        let by_id = |a: &&Candidate, b: &&Candidate| b.id.cmp(&a.id);
        let best = match self {
            Strategy::HighestScore => candidates.iter().max_by(|a, b| a.score.total_cmp(&b.score).then(by_id(a, b))),
            Strategy::PreferredNode(id) => {
                candidates.iter().find(|c| &c.id == id).or_else(|| Strategy::HighestScore.pick_candidate(candidates))
            }
            Strategy::LeastLoaded => candidates.iter().max_by(|a, b| b.load.total_cmp(&a.load).then(by_id(a, b))),
        };
        best.map(|c| c.id.as_str())
    }

    fn pick_candidate<'a>(&self, candidates: &'a [Candidate]) -> Option<&'a Candidate> {
        let id = self.pick(candidates)?;
        candidates.iter().find(|c| c.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three() -> Vec<Candidate> {
        vec![
            Candidate::new("b", 20.0).load(0.1),
            Candidate::new("a", 10.0).load(0.5),
            Candidate::new("c", 30.0).load(0.9),
        ]
    }

    #[test]
    fn each_strategy_picks_its_candidate() {
        let c = three();
        assert_eq!(Strategy::HighestScore.pick(&c), Some("c"));
        assert_eq!(Strategy::LeastLoaded.pick(&c), Some("b"));
        assert_eq!(Strategy::PreferredNode("a".into()).pick(&c), Some("a"));
        assert_eq!(Strategy::PreferredNode("gone".into()).pick(&c), Some("c"));
        assert_eq!(Strategy::HighestScore.pick(&[]), None);
    }

    #[test]
    fn ties_go_to_the_smallest_id() {
        let c = vec![Candidate::new("y", 5.0), Candidate::new("x", 5.0), Candidate::new("z", 5.0)];
        assert_eq!(Strategy::HighestScore.pick(&c), Some("x"));
        assert_eq!(Strategy::LeastLoaded.pick(&c), Some("x"));
    }
}
