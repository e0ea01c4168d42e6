//! The share arithmetic of one GPU, free of any state: who gets how many permille this period.
//!
//! Rules (DynamoML §3.1's elastic allocation, KubeShare's (request, limit)):
//! 1. every active workload is guaranteed its request; guaranteed (qos 0) requests first, and
//!    if the shared (qos >= 1) requests no longer fit beside them — an oversubscribed GPU —
//!    those are scaled down in proportion;
//! 2. an idle workload keeps its request as its share, so the moment it launches again it runs
//!    at its request (its pacer is not throttled below it), but its request is not counted as
//!    taken: it is the capacity lent to others;
//! 3. the spare capacity (the GPU minus the active requests) goes first to throttled workloads
//!    (those the pacer made wait: they want more), weighted by request, each up to its limit;
//!    what is left lets satisfied workloads keep what they hold above their request, up to
//!    their limit. When the owner of lent capacity becomes active again, the spare shrinks and
//!    the borrowers come back down on the same period.

/// Permille of one GPU.
pub const GPU_PERMILLE: u32 = 1000;

/// What a workload did over the last period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Demand {
    /// No launches for the configured number of periods.
    Idle,
    /// Launching without waiting for the pacer: its share is enough.
    Satisfied,
    /// Launching and held back by the pacer: it would use more.
    Throttled,
}

/// One workload's claim on its GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    pub id: u32,
    /// Guaranteed share, permille (clamped to the GPU).
    pub request: u32,
    /// Most it may get, permille; below the request it counts as the request.
    pub limit: u32,
    /// The share it has now.
    pub current: u32,
    /// Guaranteed (qos 0) work's requests are honoured before shared work's.
    pub guaranteed: bool,
    pub demand: Demand,
}

impl Claim {
    fn request(&self) -> u32 {
        self.request.min(GPU_PERMILLE)
    }
    fn limit(&self) -> u32 {
        self.limit.clamp(self.request(), GPU_PERMILLE)
    }
}

/// The share of every claim, in the order given.
pub fn allocate(claims: &[Claim]) -> Vec<u32> {
    let active = |c: &&Claim| c.demand != Demand::Idle;
    let guaranteed: u32 = claims
        .iter()
        .filter(active)
        .filter(|c| c.guaranteed)
        .map(Claim::request)
        .sum();
    let shared: u32 = claims
        .iter()
        .filter(active)
        .filter(|c| !c.guaranteed)
        .map(Claim::request)
        .sum();
    let room_for_shared = GPU_PERMILLE.saturating_sub(guaranteed);
    let base: Vec<u32> = claims
        .iter()
        .map(|c| {
            if c.guaranteed || c.demand == Demand::Idle || shared <= room_for_shared {
                c.request()
            } else {
                scale(c.request(), room_for_shared, shared)
            }
        })
        .collect();
    let taken: u32 = claims
        .iter()
        .zip(&base)
        .filter(|(c, _)| c.demand != Demand::Idle)
        .map(|(_, b)| *b)
        .sum();
    let mut spare = GPU_PERMILLE.saturating_sub(taken);

    let mut share = base.clone();
    // Throttled workloads first, up to their limits; then satisfied ones keep what they hold.
    for (demand, cap) in [
        (
            Demand::Throttled,
            (|c: &Claim| c.limit()) as fn(&Claim) -> u32,
        ),
        (Demand::Satisfied, |c: &Claim| c.current.min(c.limit())),
    ] {
        let wants: Vec<(usize, u32, u32)> = claims
            .iter()
            .enumerate()
            .filter(|(_, c)| c.demand == demand)
            .map(|(i, c)| (i, cap(c).saturating_sub(share[i]), c.request().max(1)))
            .filter(|&(_, want, _)| want > 0)
            .collect();
        for (i, extra) in water_fill(&wants, spare) {
            share[i] += extra;
            spare -= extra;
        }
    }
    share
}

/// `part * num / den`, rounded down.
fn scale(part: u32, num: u32, den: u32) -> u32 {
    (u64::from(part) * u64::from(num) / u64::from(den.max(1))) as u32
}

/// Splits `supply` among `(index, want, weight)` in proportion to weight, none above its want;
/// what a capped one leaves goes to the others (weighted max-min fairness). Integer permille:
/// rounding leftovers go one by one to the lowest indices still short.
fn water_fill(wants: &[(usize, u32, u32)], supply: u32) -> Vec<(usize, u32)> {
    let mut got: Vec<(usize, u32)> = wants.iter().map(|&(i, _, _)| (i, 0)).collect();
    let mut open: Vec<usize> = (0..wants.len()).collect();
    let mut left = supply;
    while left > 0 && !open.is_empty() {
        let weight: u64 = open.iter().map(|&k| u64::from(wants[k].2)).sum();
        let mut given = 0;
        for &k in &open {
            let fair = (u64::from(left) * u64::from(wants[k].2) / weight) as u32;
            let room = wants[k].1 - got[k].1;
            let g = fair.min(room);
            got[k].1 += g;
            given += g;
        }
        if given == 0 {
            // Shares smaller than one permille each: hand out the remainder one by one.
            for &k in &open {
                if left - given == 0 {
                    break;
                }
                if got[k].1 < wants[k].1 {
                    got[k].1 += 1;
                    given += 1;
                }
            }
        }
        left -= given;
        open.retain(|&k| got[k].1 < wants[k].1);
        if given == 0 {
            break;
        }
    }
    got
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(id: u32, request: u32, limit: u32, demand: Demand) -> Claim {
        Claim {
            id,
            request,
            limit,
            current: request,
            guaranteed: true,
            demand,
        }
    }

    #[test]
    fn a_burstable_workload_rises_to_its_limit_beside_idle_neighbours() {
        // The case: request 0.25 / limit 0.5 beside three idle 0.25 neighbours.
        let mut c = vec![claim(1, 250, 500, Demand::Throttled)];
        c.extend((2..5).map(|id| claim(id, 250, 250, Demand::Idle)));
        assert_eq!(allocate(&c), [500, 250, 250, 250]);
    }

    #[test]
    fn it_keeps_its_request_beside_busy_neighbours() {
        let mut c = vec![claim(1, 250, 500, Demand::Throttled)];
        c.extend((2..5).map(|id| claim(id, 250, 250, Demand::Throttled)));
        assert_eq!(allocate(&c), [250, 250, 250, 250]);
    }

    #[test]
    fn spare_is_split_by_request_among_throttled_borrowers_and_capped_by_limits() {
        // 1000 - (200 + 100) = 700 spare; weights 2:1 → 466/233, but the second caps at +150.
        let c = [
            claim(1, 200, 1000, Demand::Throttled),
            claim(2, 100, 250, Demand::Throttled),
            claim(3, 400, 400, Demand::Idle),
        ];
        let s = allocate(&c);
        assert_eq!(s[1], 250);
        assert_eq!(s[0], 750, "what the capped one leaves goes to the other");
        assert_eq!(s[2], 400, "the idle owner keeps its request ready");
        assert_eq!(s[0] + s[1], 1000, "work-conserving among active workloads");
    }

    #[test]
    fn lent_capacity_comes_back_when_the_owner_is_active_again() {
        let mut c = vec![
            claim(1, 250, 1000, Demand::Throttled),
            claim(2, 500, 500, Demand::Idle),
        ];
        assert_eq!(allocate(&c), [1000, 500]);
        c[0].current = 1000;
        c[1].demand = Demand::Satisfied;
        assert_eq!(allocate(&c), [500, 500]);
    }

    #[test]
    fn a_satisfied_workload_keeps_what_it_holds_only_while_no_throttled_one_needs_it() {
        let mut c = vec![
            Claim {
                current: 600,
                ..claim(1, 250, 750, Demand::Satisfied)
            },
            claim(2, 250, 250, Demand::Idle),
        ];
        assert_eq!(allocate(&c)[0], 600, "keeps, does not grow");
        c.push(claim(3, 250, 1000, Demand::Throttled));
        // Spare 1000 - 500 = 500 goes to the throttled one first.
        assert_eq!(allocate(&c), [250, 250, 750]);
    }

    #[test]
    fn shared_requests_are_scaled_down_when_they_no_longer_fit_beside_guaranteed_ones() {
        let c = [
            claim(1, 700, 700, Demand::Throttled),
            Claim {
                guaranteed: false,
                ..claim(2, 400, 400, Demand::Throttled)
            },
            Claim {
                guaranteed: false,
                ..claim(3, 200, 200, Demand::Satisfied)
            },
        ];
        assert_eq!(allocate(&c), [700, 200, 100]);
    }

    #[test]
    fn water_fill_hands_out_everything_it_can_and_never_more_than_wanted() {
        for supply in [0, 1, 2, 7, 333, 1000] {
            let wants = [(0, 1, 1), (1, 500, 3), (2, 2, 1000)];
            let got = water_fill(&wants, supply);
            let total: u32 = got.iter().map(|g| g.1).sum();
            assert_eq!(total, supply.min(503), "supply {supply}: {got:?}");
            for (g, w) in got.iter().zip(&wants) {
                assert!(g.1 <= w.1);
            }
        }
    }
}
