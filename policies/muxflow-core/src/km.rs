//! Kuhn–Munkres (the Hungarian method with potentials): a maximum-weight
//! bipartite matching on a rectangular weight matrix (MuxFlow §5, Alg. 1
//! l. 9–10, Fig. 9).
//!
//! Rows are one side (online workloads, or their GPUs), columns the other
//! (offline workloads). An entry that is not a positive finite number — zero,
//! negative, NaN, infinite — is a *missing* edge: it never pairs, and any row
//! or column may stay unmatched. The result maximises the sum of the weights
//! of the chosen edges.
//!
//! The implementation is the shortest-augmenting-path form of the Hungarian
//! method: the smaller side is the "row" side (`n ≤ m`), each row is added in
//! turn and the potentials `u`, `v` keep every reduced cost non-negative, so
//! one row costs `O(n·m)` and the whole matching `O(n²·m)` ⊆ `O(|V|³)`, as the
//! paper states (see `hungarian` for the form of the search). It minimises
//! the cost `−max(w, 0)`: a missing edge costs 0, the same as leaving its row
//! unassigned, so a complete assignment of the smaller side at minimum cost
//! is a maximum-weight matching once its zero-weight pairs are dropped.
//! Storage is flat (`Vec<f64>`, row-major).

/// A dense `rows × cols` matrix of edge weights, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightMatrix {
    rows: usize,
    cols: usize,
    data: Vec<f64>,
}

impl WeightMatrix {
    /// A matrix with every edge missing (weight 0).
    pub fn new(rows: usize, cols: usize) -> Self {
        WeightMatrix {
            rows,
            cols,
            data: vec![0.0; rows.saturating_mul(cols)],
        }
    }

    /// A matrix from row-major data; `None` if `data.len() != rows * cols`.
    pub fn from_rows(rows: usize, cols: usize, data: Vec<f64>) -> Option<Self> {
        (rows.checked_mul(cols) == Some(data.len())).then_some(WeightMatrix { rows, cols, data })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The weight of edge (`row`, `col`); 0 outside the matrix.
    pub fn get(&self, row: usize, col: usize) -> f64 {
        if row < self.rows && col < self.cols {
            self.data[row * self.cols + col]
        } else {
            0.0
        }
    }

    /// Sets the weight of edge (`row`, `col`); ignored outside the matrix.
    pub fn set(&mut self, row: usize, col: usize, weight: f64) {
        if row < self.rows && col < self.cols {
            self.data[row * self.cols + col] = weight;
        }
    }
}

/// The weight an entry counts for: positive finite, else 0 (no edge).
#[inline]
fn usable(w: f64) -> f64 {
    if w.is_finite() && w > 0.0 { w } else { 0.0 }
}

/// A matching: disjoint (row, column) pairs, sorted by row, and their total.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Matching {
    pub pairs: Vec<(usize, usize)>,
    pub total: f64,
}

impl Matching {
    /// The column matched to `row`, if any.
    pub fn col_of(&self, row: usize) -> Option<usize> {
        self.pairs.iter().find(|p| p.0 == row).map(|p| p.1)
    }
}

/// The maximum-weight matching of `weights` (see the module doc).
pub fn max_weight_matching(weights: &WeightMatrix) -> Matching {
    let (rows, cols) = (weights.rows, weights.cols);
    if rows == 0 || cols == 0 {
        return Matching::default();
    }
    // The algorithm wants n <= m: transpose when there are more rows.
    let transposed = rows > cols;
    let (n, m) = if transposed {
        (cols, rows)
    } else {
        (rows, cols)
    };
    // Costs, n x m row-major.
    let mut cost = vec![0.0f64; n * m];
    for (i, row) in cost.chunks_exact_mut(m).enumerate() {
        for (j, c) in row.iter_mut().enumerate() {
            let w = if transposed {
                weights.get(j, i)
            } else {
                weights.get(i, j)
            };
            *c = -usable(w);
        }
    }
    let col_of_row = hungarian(&cost, n, m);
    let mut pairs: Vec<(usize, usize)> = Vec::new();
    for (i, &j) in col_of_row.iter().enumerate() {
        if j == UNASSIGNED {
            continue;
        }
        let (r, c) = if transposed { (j, i) } else { (i, j) };
        if usable(weights.get(r, c)) > 0.0 {
            pairs.push((r, c));
        }
    }
    pairs.sort_unstable();
    let total = pairs.iter().map(|&(r, c)| weights.get(r, c)).sum();
    Matching { pairs, total }
}

const UNASSIGNED: usize = usize::MAX;

/// Minimum-cost assignment of every row `0..n` to a distinct column of
/// `0..m` (`n <= m`), costs row-major in `cost[i * m + j]`. Returns the
/// column of each row.
///
/// One shortest augmenting path per row over the reduced costs
/// `cost - u - v` (Dijkstra, the potentials keep them non-negative), in the
/// form of Crouse (2016, "On implementing 2D rectangular assignment
/// algorithms"): path lengths are kept as they are found and the potentials
/// updated once per row, so each step of the search is one pass over the
/// columns not reached yet; among equally near columns an unassigned one is
/// taken, which ends the search at once. The matcher's weights tie often
/// (similar jobs get similar predictions), which is where the textbook form,
/// updating every potential at every step, spent its time.
///
/// The columns' state lives in [`Columns`], ordered so that the columns a
/// search has not reached are a prefix: the pass that is the whole cost is a
/// sequential scan of a few slices (and one read of the row's costs per
/// column), with no bounds checks left in it — which is what a Wasm build of
/// this loop needs to come near the native one.
fn hungarian(cost: &[f64], n: usize, m: usize) -> Vec<usize> {
    // Indices are kept as u32 (half the bytes the scan reads on a 64-bit
    // host); a side of 2^32 workloads is far beyond a cluster.
    let (Ok(n32), Ok(m32)) = (u32::try_from(n), u32::try_from(m)) else {
        return vec![UNASSIGNED; n];
    };
    let mut u = vec![0.0f64; n];
    let mut cols = Columns::new(m32);
    let mut col_of_row = vec![NONE; n];
    let mut scanned_rows: Vec<u32> = Vec::with_capacity(n);
    for cur_row in 0..n32 {
        cols.dist.fill(f64::INFINITY);
        scanned_rows.clear();
        let mut unreached = m;
        let mut min_val = 0.0f64;
        let mut i = cur_row;
        let sink = loop {
            scanned_rows.push(i);
            let start = i as usize * m;
            let row = &cost[start..start + m];
            let base = min_val - u[i as usize];
            let mut lowest = f64::INFINITY;
            let mut index = usize::MAX;
            let reach = cols.id[..unreached]
                .iter()
                .zip(&cols.v[..unreached])
                .zip(&mut cols.dist[..unreached])
                .zip(&mut cols.via[..unreached])
                .zip(&cols.owner[..unreached]);
            for (k, ((((&j, &v), dist), via), &owner)) in reach.enumerate() {
                let r = base + row.get(j as usize).copied().unwrap_or(f64::INFINITY) - v;
                if r < *dist {
                    *via = i;
                    *dist = r;
                }
                if *dist < lowest || (*dist == lowest && owner == NONE) {
                    lowest = *dist;
                    index = k;
                }
            }
            if index == usize::MAX {
                // Unreachable with finite costs and n <= m (a column always
                // remains); leave the row unassigned rather than loop.
                break NONE;
            }
            min_val = lowest;
            unreached -= 1;
            cols.swap(index, unreached);
            let j = cols.id[unreached];
            match cols.owner[unreached] {
                NONE => break j,
                owner => i = owner,
            }
        };
        if sink == NONE {
            continue;
        }
        // The potentials, once for the whole search: the reached columns
        // are the suffix from `unreached` on.
        u[cur_row as usize] += min_val;
        for &r in &scanned_rows[1..] {
            let j = col_of_row[r as usize];
            u[r as usize] += min_val - cols.dist[cols.pos[j as usize] as usize];
        }
        for (v, dist) in cols.v[unreached..].iter_mut().zip(&cols.dist[unreached..]) {
            *v -= min_val - dist;
        }
        // Flip the augmenting path back to the root.
        let mut j = sink;
        loop {
            let k = cols.pos[j as usize] as usize;
            let r = cols.via[k];
            cols.owner[k] = r;
            std::mem::swap(&mut col_of_row[r as usize], &mut j);
            if r == cur_row {
                break;
            }
        }
    }
    col_of_row
        .into_iter()
        .map(|j| if j == NONE { UNASSIGNED } else { j as usize })
        .collect()
}

/// "No row" / "no column" among [`hungarian`]'s u32 indices.
const NONE: u32 = u32::MAX;

/// Every column's state for [`hungarian`], by position (`pos[j]`: where
/// column `j` is).
struct Columns {
    id: Vec<u32>,
    v: Vec<f64>,
    /// Path length from the search's root (this search).
    dist: Vec<f64>,
    /// The row the shortest path reaches the column from (this search).
    via: Vec<u32>,
    /// The row assigned to the column, or [`NONE`].
    owner: Vec<u32>,
    pos: Vec<u32>,
}

impl Columns {
    fn new(m: u32) -> Columns {
        let len = m as usize;
        Columns {
            id: (0..m).collect(),
            v: vec![0.0; len],
            dist: vec![f64::INFINITY; len],
            via: vec![NONE; len],
            owner: vec![NONE; len],
            pos: (0..m).collect(),
        }
    }

    /// Swaps the columns at positions `a` and `b`.
    fn swap(&mut self, a: usize, b: usize) {
        self.id.swap(a, b);
        self.v.swap(a, b);
        self.dist.swap(a, b);
        self.via.swap(a, b);
        self.owner.swap(a, b);
        self.pos[self.id[a] as usize] = a as u32;
        self.pos[self.id[b] as usize] = b as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Figure 9: online A, B (rows); offline C, D, E (columns).
    fn figure_9(a_e: f64, b_d: f64) -> WeightMatrix {
        // A–C 0.3, A–D 0.8, B–C 0.8, B–E 0.4; {0.4, 0.3} on A–E / B–D.
        WeightMatrix::from_rows(2, 3, vec![0.3, 0.8, a_e, 0.8, b_d, 0.4]).unwrap_or_else(|| {
            panic!("2 x 3");
        })
    }

    #[test]
    fn figure_9_plan_1_beats_plan_2_in_either_order_of_the_unlabelled_weights() {
        for (a_e, b_d) in [(0.4, 0.3), (0.3, 0.4)] {
            let w = figure_9(a_e, b_d);
            let m = max_weight_matching(&w);
            assert_eq!(m.pairs, vec![(0, 1), (1, 0)], "plan 1: (A, D), (B, C)");
            assert!((m.total - 1.6).abs() < 1e-12, "total {}", m.total);
            // E (column 2) stays unmatched; plan 2 = (A,C),(B,E) is worth 0.7.
            assert!(m.pairs.iter().all(|&(_, c)| c != 2));
            let plan_2 = w.get(0, 0) + w.get(1, 2);
            assert!((plan_2 - 0.7).abs() < 1e-12);
            assert!(m.total > plan_2);
            // Transposed (offline as rows) gives the same matching.
            let t = transpose(&w);
            let mt = max_weight_matching(&t);
            assert_eq!(mt.pairs, vec![(0, 1), (1, 0)]);
            assert!((mt.total - 1.6).abs() < 1e-12);
        }
    }

    #[test]
    fn missing_and_non_positive_edges_never_pair() {
        // Only the four labelled edges of Fig. 9.
        let w = WeightMatrix::from_rows(2, 3, vec![0.3, 0.8, 0.0, 0.8, 0.0, 0.4]).unwrap();
        let m = max_weight_matching(&w);
        assert_eq!(m.pairs, vec![(0, 1), (1, 0)]);
        // A row with only negative / NaN / infinite edges stays unmatched.
        let w = WeightMatrix::from_rows(2, 2, vec![-1.0, f64::NAN, 0.5, f64::INFINITY]).unwrap();
        let m = max_weight_matching(&w);
        assert_eq!(m.pairs, vec![(1, 0)]);
        assert_eq!(m.total, 0.5);
        assert_eq!(max_weight_matching(&WeightMatrix::new(3, 4)).pairs, vec![]);
        assert_eq!(max_weight_matching(&WeightMatrix::new(0, 4)).pairs, vec![]);
    }

    #[test]
    fn matching_below_a_complete_assignment_is_preferred_when_it_weighs_more() {
        // A full assignment would be (0,1)+(1,0) = 2; leaving row 1 unmatched
        // and taking (0,0) = 5 is better.
        let w = WeightMatrix::from_rows(2, 2, vec![5.0, 1.0, 1.0, 0.0]).unwrap();
        let m = max_weight_matching(&w);
        assert_eq!(m.pairs, vec![(0, 0)]);
        assert_eq!(m.total, 5.0);
        assert_eq!(m.col_of(0), Some(0));
        assert_eq!(m.col_of(1), None);
    }

    fn transpose(w: &WeightMatrix) -> WeightMatrix {
        let mut t = WeightMatrix::new(w.cols(), w.rows());
        for r in 0..w.rows() {
            for c in 0..w.cols() {
                t.set(c, r, w.get(r, c));
            }
        }
        t
    }

    /// The best total over every matching, by exhaustive search.
    fn brute_force(w: &WeightMatrix) -> f64 {
        fn go(w: &WeightMatrix, row: usize, used: &mut Vec<bool>) -> f64 {
            if row == w.rows() {
                return 0.0;
            }
            let mut best = go(w, row + 1, used); // row unmatched
            for c in 0..w.cols() {
                let x = usable(w.get(row, c));
                if !used[c] && x > 0.0 {
                    used[c] = true;
                    best = best.max(x + go(w, row + 1, used));
                    used[c] = false;
                }
            }
            best
        }
        go(w, 0, &mut vec![false; w.cols()])
    }

    /// A small deterministic generator (xorshift64*).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn km_total_equals_the_brute_force_optimum_on_random_small_matrices() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for case in 0..3000 {
            let rows = rng.below(7) as usize;
            let cols = rng.below(7) as usize;
            let mut w = WeightMatrix::new(rows, cols);
            for r in 0..rows {
                for c in 0..cols {
                    // About a third missing or negative; integer-ish weights
                    // make ties common, fractions make them rare.
                    let x = match rng.below(6) {
                        0 => 0.0,
                        1 => -(rng.below(10) as f64),
                        2 => rng.below(4) as f64,
                        _ => rng.below(1000) as f64 / 997.0,
                    };
                    w.set(r, c, x);
                }
            }
            let m = max_weight_matching(&w);
            let best = brute_force(&w);
            assert!(
                (m.total - best).abs() < 1e-9,
                "case {case}: KM {} vs brute force {best} on {w:?}",
                m.total
            );
            // The pairs are a matching of positive edges.
            let mut rows_seen = vec![false; rows];
            let mut cols_seen = vec![false; cols];
            for &(r, c) in &m.pairs {
                assert!(!rows_seen[r] && !cols_seen[c], "case {case}: not disjoint");
                rows_seen[r] = true;
                cols_seen[c] = true;
                assert!(
                    usable(w.get(r, c)) > 0.0,
                    "case {case}: a missing edge paired"
                );
            }
        }
    }

    #[test]
    fn all_tied_weights_match_every_row_of_the_smaller_side() {
        // The degenerate case the search's tie-break is for: every pair the
        // same, or one of two values; any complete matching is optimal.
        for (rows, cols) in [(300, 400), (400, 300), (250, 250)] {
            let mut w = WeightMatrix::new(rows, cols);
            for r in 0..rows {
                for c in 0..cols {
                    w.set(r, c, if (r + c) % 7 == 0 { 2.0 } else { 1.0 });
                }
            }
            let m = max_weight_matching(&w);
            assert_eq!(m.pairs.len(), rows.min(cols));
            // The 2.0 edges join rows of residue a (mod 7) to columns of
            // residue -a: as many of them as the smaller of the two classes.
            let class = |len: usize, a: usize| (0..len).filter(|x| x % 7 == a).count();
            let heavy: usize = (0..7)
                .map(|a| class(rows, a).min(class(cols, (7 - a) % 7)))
                .sum();
            let best = rows.min(cols) as f64 + heavy as f64;
            assert!((m.total - best).abs() < 1e-9, "{} vs {best}", m.total);
        }
    }

    #[test]
    fn a_large_matrix_matches_completely_on_a_planted_optimum() {
        // 300 x 400: row i's best column is i (weight 2), all others ≤ 1, so
        // the optimum is the planted diagonal, total 600.
        let (rows, cols) = (300, 400);
        let mut rng = Rng(7);
        let mut w = WeightMatrix::new(rows, cols);
        for r in 0..rows {
            for c in 0..cols {
                w.set(r, c, rng.below(1000) as f64 / 1000.0);
            }
            w.set(r, r, 2.0);
        }
        let m = max_weight_matching(&w);
        assert_eq!(m.pairs.len(), rows);
        assert!(m.pairs.iter().all(|&(r, c)| r == c));
        assert!((m.total - 600.0).abs() < 1e-9);
    }
}
