//! Multiple-choice knapsack by dynamic programming (Aryl §5.2, Appendix D
//! `MaxValueDP`).
//!
//! Each group is one elastic job; its items are the possible allocations of
//! the job's flexible demand; at most one item per group may be taken and the
//! total weight must fit the capacity (the GPUs left after phase one).

/// One possible choice of a group.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Item {
    /// GPUs this choice takes.
    pub weight: u32,
    /// JCT reduction it brings.
    pub value: f64,
}

/// The DP's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Solution {
    /// Per group: the index of the chosen item, or `None`.
    pub choice: Vec<Option<usize>>,
    pub value: f64,
    pub weight: u64,
    /// Weight unit the DP ran with (1 unless the instance was coarsened to
    /// stay within the cell budget; see [`solve`]).
    pub unit: u32,
}

/// Solves the multiple-choice knapsack exactly with at most `max_cells`
/// DP cells (`Σ items × (capacity + 1)`).
///
/// The capacity is first cut to what the groups could use at all (the sum of
/// their heaviest items) — in a busy cluster that is far below the free GPUs.
/// If the instance is still larger than the budget, weights are measured in a
/// coarser unit `u` (item weights rounded *up*, capacity rounded *down*), so
/// the answer stays feasible and the running time stays bounded; `u = 1`
/// whenever the budget allows, which is then the exact optimum.
///
/// Items with a non-positive value or zero weight are never taken (taking
/// them cannot reduce JCT). Ties keep the lighter choice.
pub fn solve(groups: &[Vec<Item>], capacity: u64, max_cells: u64) -> Solution {
    let useful: u64 = groups
        .iter()
        .map(|g| g.iter().map(|i| u64::from(i.weight)).max().unwrap_or(0))
        .sum();
    let cap = capacity.min(useful);
    let items: u64 = groups.iter().map(|g| g.len() as u64).sum::<u64>() + groups.len() as u64;
    let cells = items.saturating_mul(cap + 1);
    let unit = if max_cells == 0 || cells <= max_cells {
        1
    } else {
        cells.div_ceil(max_cells).min(u64::from(u32::MAX)) as u32
    };
    let u = u64::from(unit);
    let cap_units = (cap / u) as usize;
    let width = cap_units + 1;

    // best[c]: best value with weight ≤ c over the groups seen so far.
    let mut best = vec![0.0f64; width];
    let mut next = vec![0.0f64; width];
    // choice[g * width + c]: item taken for group g at capacity c (0 = none).
    let mut choice = vec![0u16; groups.len() * width];
    for (g, group) in groups.iter().enumerate() {
        next.copy_from_slice(&best);
        let row = &mut choice[g * width..(g + 1) * width];
        for (i, item) in group.iter().enumerate().take(usize::from(u16::MAX) - 1) {
            if item.weight == 0 || item.value <= 0.0 {
                continue;
            }
            let w = u64::from(item.weight).div_ceil(u) as usize;
            if w > cap_units {
                continue;
            }
            for c in w..width {
                let candidate = best[c - w] + item.value;
                if candidate > next[c] + 1e-12 {
                    next[c] = candidate;
                    row[c] = (i + 1) as u16;
                }
            }
        }
        std::mem::swap(&mut best, &mut next);
    }

    // Walk back from the full capacity.
    let mut chosen = vec![None; groups.len()];
    let mut c = cap_units;
    let mut weight = 0u64;
    for g in (0..groups.len()).rev() {
        let pick = choice[g * width + c];
        if pick > 0 {
            let i = usize::from(pick - 1);
            chosen[g] = Some(i);
            let w = u64::from(groups[g][i].weight);
            weight += w;
            c -= w.div_ceil(u) as usize;
        }
    }
    let value = chosen
        .iter()
        .enumerate()
        .filter_map(|(g, pick)| pick.map(|i| groups[g][i].value))
        .sum();
    Solution {
        choice: chosen,
        value,
        weight,
        unit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(weight: u32, value: f64) -> Item {
        Item { weight, value }
    }

    /// Brute force over all choices, for cross-checking the DP.
    fn brute(groups: &[Vec<Item>], capacity: u64) -> f64 {
        fn go(groups: &[Vec<Item>], g: usize, left: u64) -> f64 {
            if g == groups.len() {
                return 0.0;
            }
            let mut best = go(groups, g + 1, left);
            for it in &groups[g] {
                if u64::from(it.weight) <= left && it.value > 0.0 {
                    best = best.max(it.value + go(groups, g + 1, left - u64::from(it.weight)));
                }
            }
            best
        }
        go(groups, 0, capacity)
    }

    #[test]
    fn dp_matches_brute_force_on_small_instances() {
        // A deterministic family of instances (xorshift), no external RNG.
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for _ in 0..200 {
            let groups: Vec<Vec<Item>> = (0..(next() % 4 + 1))
                .map(|_| {
                    (0..(next() % 4 + 1))
                        .map(|_| item((next() % 6 + 1) as u32, (next() % 100) as f64))
                        .collect()
                })
                .collect();
            let cap = next() % 12;
            let sol = solve(&groups, cap, 1 << 20);
            assert_eq!(sol.unit, 1);
            assert!((sol.value - brute(&groups, cap)).abs() < 1e-9);
            assert!(sol.weight <= cap);
        }
    }

    #[test]
    fn at_most_one_item_per_group() {
        let groups = vec![vec![item(1, 10.0), item(2, 15.0)]];
        let sol = solve(&groups, 10, 1 << 20);
        assert_eq!(sol.choice, vec![Some(1)]);
        assert_eq!(sol.weight, 2);
    }

    #[test]
    fn coarsening_keeps_the_answer_feasible_and_bounded() {
        let groups: Vec<Vec<Item>> = (0..50)
            .map(|g| (1..=16).map(|w| item(w * 8, f64::from(w + g))).collect())
            .collect();
        let sol = solve(&groups, 3_000, 10_000);
        assert!(sol.unit > 1);
        assert!(sol.weight <= 3_000);
        assert!(sol.value > 0.0);
    }
}
