//! A regression tree as "MLaaS in the Wild" §5.2 trains its duration
//! predictor: CART with at most 10 splits and mean absolute error as the
//! splitting criterion ("more robust to extreme outliers in heavy-tailed
//! distributions" than squared error), so every leaf predicts the median of
//! its samples.
//!
//! Hand-written because none of the Rust learning crates we looked at
//! (smartcore, linfa-trees) offers the MAE criterion, and the paper's
//! choice matters on run times spanning five orders of magnitude: a
//! squared-error tree chases the few week-long jobs.
//!
//! Features are numbers; a categorical one (a virtual cluster, a user) is
//! given as its rank among the categories ordered by their median target in
//! the training set ([`rank_by_median`]), so that one threshold can split
//! the categories into the two groups CART would consider best for a
//! monotone target — the usual ordering trick, exact for squared error and
//! a heuristic for absolute error. The tree grows best-first: the leaf
//! whose best split lowers the total absolute error most is split next,
//! until `max_splits` splits or no split helps.
//!
//! ```
//! use arbiter_repro::pai::cart::RegressionTree;
//! // Duration doubles with the GPU count (feature 0).
//! let x: Vec<Vec<f64>> = (0..40).map(|i| vec![f64::from(1 + i % 2)]).collect();
//! let y: Vec<f64> = x.iter().map(|f| 100.0 * f[0]).collect();
//! let tree = RegressionTree::fit(&x, &y, 10, 1).unwrap();
//! assert_eq!(tree.predict(&[1.0]), 100.0);
//! assert_eq!(tree.predict(&[2.0]), 200.0);
//! assert_eq!(tree.splits(), 1);
//! ```

use anyhow::bail;
use std::collections::BTreeMap;

/// A fitted tree: internal nodes test `feature <= threshold`.
#[derive(Clone, Debug, PartialEq)]
pub struct RegressionTree {
    nodes: Vec<Node>,
}

#[derive(Clone, Debug, PartialEq)]
enum Node {
    Leaf(f64),
    Split {
        feature: usize,
        threshold: f64,
        left: usize,
        right: usize,
    },
}

/// The best split of one leaf's samples.
struct Candidate {
    /// Total absolute error removed by the split.
    gain: f64,
    feature: usize,
    threshold: f64,
}

/// Median of `values` (reordered); 0 for none.
fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mid = values.len() / 2;
    let (_, m, _) = values.select_nth_unstable_by(mid, f64::total_cmp);
    *m
}

/// Sum of absolute deviations from the median of `values` (reordered).
fn abs_error(values: &mut [f64]) -> f64 {
    let m = median(values);
    values.iter().map(|v| (v - m).abs()).sum()
}

impl RegressionTree {
    /// Fits `y` on the rows of `x` (each the same number of features) with
    /// at most `max_splits` splits, each side of a split keeping at least
    /// `min_leaf` samples.
    pub fn fit(
        x: &[Vec<f64>],
        y: &[f64],
        max_splits: usize,
        min_leaf: usize,
    ) -> anyhow::Result<Self> {
        if x.is_empty() || x.len() != y.len() {
            bail!(
                "a tree needs samples, and a target for each ({} rows, {} targets)",
                x.len(),
                y.len()
            );
        }
        let width = x[0].len();
        if x.iter().any(|row| row.len() != width)
            || x.iter().flatten().chain(y).any(|v| !v.is_finite())
        {
            bail!("every row needs {width} finite features and a finite target");
        }
        let min_leaf = min_leaf.max(1);
        let mut tree = RegressionTree { nodes: Vec::new() };
        // Open leaves: (node index, its samples, its best split).
        let mut open: Vec<(usize, Vec<usize>, Option<Candidate>)> = Vec::new();
        let all: Vec<usize> = (0..x.len()).collect();
        tree.nodes.push(Node::Leaf(leaf_value(&all, y)));
        let best = best_split(&all, x, y, min_leaf);
        open.push((0, all, best));
        for _ in 0..max_splits {
            let Some(pick) = open
                .iter()
                .enumerate()
                .filter_map(|(i, (_, _, c))| c.as_ref().map(|c| (i, c.gain)))
                .filter(|&(_, gain)| gain > 0.0)
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map(|(i, _)| i)
            else {
                break;
            };
            let (node, samples, candidate) = open.swap_remove(pick);
            let Some(c) = candidate else { break };
            let (l, r): (Vec<usize>, Vec<usize>) = samples
                .into_iter()
                .partition(|&s| x[s][c.feature] <= c.threshold);
            let (left, right) = (tree.nodes.len(), tree.nodes.len() + 1);
            tree.nodes.push(Node::Leaf(leaf_value(&l, y)));
            tree.nodes.push(Node::Leaf(leaf_value(&r, y)));
            tree.nodes[node] = Node::Split {
                feature: c.feature,
                threshold: c.threshold,
                left,
                right,
            };
            let (bl, br) = (
                best_split(&l, x, y, min_leaf),
                best_split(&r, x, y, min_leaf),
            );
            open.push((left, l, bl));
            open.push((right, r, br));
        }
        Ok(tree)
    }

    /// The prediction for one row of features.
    pub fn predict(&self, row: &[f64]) -> f64 {
        let mut at = 0;
        loop {
            match &self.nodes[at] {
                Node::Leaf(v) => return *v,
                Node::Split {
                    feature,
                    threshold,
                    left,
                    right,
                } => {
                    let v = row.get(*feature).copied().unwrap_or(f64::NAN);
                    // A missing or NaN feature goes left (the smaller side).
                    at = if v > *threshold { *right } else { *left };
                }
            }
        }
    }

    /// Splits made.
    pub fn splits(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| matches!(n, Node::Split { .. }))
            .count()
    }
}

fn leaf_value(samples: &[usize], y: &[f64]) -> f64 {
    let mut v: Vec<f64> = samples.iter().map(|&s| y[s]).collect();
    median(&mut v)
}

/// The split of `samples` that removes the most absolute error, trying a
/// threshold between each pair of neighbouring distinct feature values (a
/// pass over the samples per threshold: fine for features with few
/// distinct values — clusters, GPU counts — quadratic for continuous ones).
fn best_split(samples: &[usize], x: &[Vec<f64>], y: &[f64], min_leaf: usize) -> Option<Candidate> {
    if samples.len() < 2 * min_leaf {
        return None;
    }
    let mut all: Vec<f64> = samples.iter().map(|&s| y[s]).collect();
    let before = abs_error(&mut all);
    (0..x[samples[0]].len())
        .filter_map(|feature| split_on(feature, samples, x, y, min_leaf, before))
        .fold(None, |best: Option<Candidate>, c| match best {
            Some(b) if b.gain >= c.gain => Some(b),
            _ => Some(c),
        })
}

/// The best threshold on one feature.
fn split_on(
    feature: usize,
    samples: &[usize],
    x: &[Vec<f64>],
    y: &[f64],
    min_leaf: usize,
    before: f64,
) -> Option<Candidate> {
    let value = |s: usize| x[s][feature];
    let mut order: Vec<usize> = samples.to_vec();
    order.sort_by(|&a, &b| value(a).total_cmp(&value(b)));
    let mut best: Option<Candidate> = None;
    let mut cut = 0;
    while cut < order.len() {
        // Move past every sample with the value at `cut`.
        let at = value(order[cut]);
        while cut < order.len() && value(order[cut]) == at {
            cut += 1;
        }
        if cut < min_leaf || order.len() - cut < min_leaf {
            continue;
        }
        let mut left: Vec<f64> = order[..cut].iter().map(|&s| y[s]).collect();
        let mut right: Vec<f64> = order[cut..].iter().map(|&s| y[s]).collect();
        let gain = before - abs_error(&mut left) - abs_error(&mut right);
        if best.as_ref().is_none_or(|b| gain > b.gain) {
            best = Some(Candidate {
                gain,
                feature,
                threshold: (at + value(order[cut])) / 2.0,
            });
        }
    }
    best
}

/// Each category's rank (0, 1, …) when the categories are ordered by the
/// median of their targets (ties by name), for use as a tree feature;
/// categories unseen in training get no rank.
pub fn rank_by_median<K: Ord + Clone>(categories: &[K], y: &[f64]) -> BTreeMap<K, f64> {
    let mut by: BTreeMap<K, Vec<f64>> = BTreeMap::new();
    for (k, &v) in categories.iter().zip(y) {
        by.entry(k.clone()).or_default().push(v);
    }
    let mut medians: Vec<(f64, K)> = by
        .into_iter()
        .map(|(k, mut v)| (median(&mut v), k))
        .collect();
    medians.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    medians
        .into_iter()
        .enumerate()
        .map(|(rank, (_, k))| (k, rank as f64))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MAE, not squared error: one huge outlier does not move a leaf, and
    /// the split goes where the medians differ, not where the outlier is.
    #[test]
    fn absolute_error_splits_ignore_outliers() {
        let mut x = Vec::new();
        let mut y = Vec::new();
        for i in 0..100 {
            let group = f64::from(i % 2);
            x.push(vec![group, f64::from(i % 5)]);
            y.push(if group == 0.0 { 60.0 } else { 600.0 });
        }
        // A week-long job in group 0.
        y[0] = 604_800.0;
        let tree = RegressionTree::fit(&x, &y, 10, 5).unwrap();
        assert_eq!(tree.predict(&[0.0, 3.0]), 60.0);
        assert_eq!(tree.predict(&[1.0, 3.0]), 600.0);
        // Feature 1 explains nothing further: one split is enough (the
        // outlier alone cannot be cut off with leaves of 5).
        assert_eq!(tree.splits(), 1);
    }

    #[test]
    fn at_most_max_splits_and_min_leaf() {
        let x: Vec<Vec<f64>> = (0..64).map(|i| vec![f64::from(i)]).collect();
        let y: Vec<f64> = (0..64).map(f64::from).collect();
        assert_eq!(RegressionTree::fit(&x, &y, 3, 1).unwrap().splits(), 3);
        assert_eq!(RegressionTree::fit(&x, &y, 10, 1).unwrap().splits(), 10);
        // Leaves of at least 32: one split only.
        assert_eq!(RegressionTree::fit(&x, &y, 10, 32).unwrap().splits(), 1);
        assert!(RegressionTree::fit(&[], &[], 10, 1).is_err());
        assert!(RegressionTree::fit(&[vec![f64::NAN]], &[1.0], 10, 1).is_err());
    }

    #[test]
    fn categories_rank_by_their_median() {
        let ranks = rank_by_median(&["b", "a", "b", "c"], &[10.0, 50.0, 12.0, 1.0]);
        assert_eq!(ranks["c"], 0.0);
        assert_eq!(ranks["b"], 1.0);
        assert_eq!(ranks["a"], 2.0);
    }
}
