//! Dynamic SM allocation (MuxFlow §4.3, Fig. 8; Alg. 1 l. 5–6 `DynamicSM`).
//!
//! The offline workload gets the SMs its online partner leaves: its SM
//! percentage (the MPS active-thread %) is `100 − online SM activity`, less
//! an optional headroom, kept within `[min_pct, max_pct]`. With a fixed 40 %,
//! Fig. 8's online A (20 % of SMs) leaves 40 % idle and B (80 %) is squeezed
//! by an offline job asking for 40 %; the dynamic share gives C 80 % beside A
//! and D 20 % beside B, using every SM without contention.
//!
//! The paper gives the rule and no bounds: `min_pct`, `max_pct` and
//! `headroom_pct` are ours (defaults 10, 90 and 0; see [`SmBounds`]).

use serde::Deserialize;

/// The bounds of the offline SM share, percent (see the module doc).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct SmBounds {
    /// The least share an offline job is given, however busy its partner
    /// (ours: 10 %, so a paired job always progresses; MPS needs ≥ 1 %).
    pub min_pct: u8,
    /// The most share an offline job is given, however idle its partner
    /// (ours: 90 %, so the online job keeps room for a burst before
    /// SysMonitor and xCUDA react).
    pub max_pct: u8,
    /// SM percentage held back for the online workload beyond its measured
    /// activity (ours: 0, the paper's exact complement).
    pub headroom_pct: u8,
}

impl Default for SmBounds {
    fn default() -> Self {
        SmBounds {
            min_pct: 10,
            max_pct: 90,
            headroom_pct: 0,
        }
    }
}

impl SmBounds {
    /// Checks `1 <= min_pct <= max_pct <= 100` and `headroom_pct <= 100`.
    pub fn validate(&self) -> Result<(), String> {
        if self.min_pct == 0 || self.max_pct > 100 || self.min_pct > self.max_pct {
            return Err(format!(
                "dynamic_sm: need 1 <= min_pct ({}) <= max_pct ({}) <= 100",
                self.min_pct, self.max_pct
            ));
        }
        if self.headroom_pct > 100 {
            return Err(format!(
                "dynamic_sm: headroom_pct {} is above 100",
                self.headroom_pct
            ));
        }
        Ok(())
    }
}

/// The offline workload's SM percentage beside an online workload whose SM
/// activity alone is `online_sm_activity_pct` (clamped to 0..=100).
pub fn dynamic_sm(online_sm_activity_pct: u8, bounds: &SmBounds) -> u8 {
    let left = 100u8
        .saturating_sub(online_sm_activity_pct.min(100))
        .saturating_sub(bounds.headroom_pct);
    left.clamp(bounds.min_pct, bounds.max_pct.max(bounds.min_pct))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figure_8_c_gets_80_beside_a_and_d_gets_20_beside_b() {
        let b = SmBounds::default();
        assert_eq!(dynamic_sm(20, &b), 80, "C beside A (20 % SMs)");
        assert_eq!(dynamic_sm(80, &b), 20, "D beside B (80 % SMs)");
        // Together with its partner every SM is used and none is contended.
        assert_eq!(20 + dynamic_sm(20, &b), 100);
        assert_eq!(80 + dynamic_sm(80, &b), 100);
    }

    #[test]
    fn the_share_stays_within_its_bounds_and_honours_headroom() {
        let b = SmBounds::default();
        assert_eq!(dynamic_sm(0, &b), 90);
        assert_eq!(dynamic_sm(100, &b), 10);
        assert_eq!(dynamic_sm(255, &b), 10, "activity above 100 % is 100 %");
        let h = SmBounds {
            min_pct: 5,
            max_pct: 100,
            headroom_pct: 10,
        };
        assert_eq!(dynamic_sm(20, &h), 70);
        assert_eq!(dynamic_sm(0, &h), 90);
        assert_eq!(dynamic_sm(99, &h), 5);
        assert!(h.validate().is_ok());
        assert!(SmBounds { min_pct: 0, ..b }.validate().is_err());
        assert!(SmBounds { min_pct: 95, ..b }.validate().is_err());
        assert!(SmBounds { max_pct: 101, ..b }.validate().is_err());
    }
}
