//! [`NodeOrder`]: every node sorted by a placement policy's preference, kept
//! sorted while a round's [`Plan`] charges nodes, so that "the first node in
//! my order where this worker fits" costs about `log nodes` instead of a scan
//! of every node.
//!
//! A policy gives each node a key (an integer — `u128` by default, `u64`
//! where the policy's order fits in 32 bits above the node: narrower keys
//! sort and compare faster, in Wasm most of all — that sorts in its order of
//! preference, the node's index in the low 32 bits so that keys are unique
//! and name their node) and asks [`NodeOrder::first_fit`] for the first node
//! whose key lies in a range and where one worker fits ([`Plan::fits`]).
//! Only the nodes the plan charges or releases change key, and the plan only
//! charges nodes a query handed out: those are re-keyed before the next
//! query. A policy keeping two orders over one plan (one per class of job)
//! tells the other order about a node it placed on with [`NodeOrder::touch`].
//!
//! The walk checks nodes one by one at [`Plan::fits`]'s price, so after
//! [`WALK_BUDGET`] nodes that do not fit it finishes with one pass of
//! [`Plan::each_fitting_node`] instead (the same answer: the least key in
//! range among the fitting nodes). A worker that fits nowhere — a queue of
//! jobs waiting for scarce nodes — then costs what a scan costs, not a walk
//! over every node.
//!
//! Two sorted arrays, no tree: the order at the start of the round, and the
//! (few) nodes whose key moved since, merged while walking. A base entry
//! whose node has moved is skipped. Flat arrays keep the guest's allocator
//! out of the round, which matters more in Wasm than natively. Once more
//! than about √nodes keys have moved, they are merged into the base (one
//! linear pass): a packing policy charges the nodes at the front of its
//! order, so without it every query would walk past the stale base entries
//! of every node placed on so far — a round of `p` placements would cost
//! `p²` (with the merge, about `p·√nodes`; BENCHMARKS.md, scaling round).
//!
//! ```
//! use arbiter_policy_sdk::node_order::NodeOrder;
//! use arbiter_policy_sdk::prelude::*;
//! let mut c = TestCluster::new();
//! for n in 0..4 {
//!     c.node(&format!("n{n}"), "p", 64_000, 256_000, "T4", 16_384, 2);
//! }
//! let job = c.job("j", "t", 1, 1);
//! let plan = Plan::new(c.cluster());
//! // Prefer the highest node index: key = (MAX - node) above, node below.
//! let key = |n: u32| (u128::from(u32::MAX - n) << 32) | u128::from(n);
//! let mut order = NodeOrder::new(4, key);
//! let fit = plan.job_fit(job);
//! assert_eq!(order.first_fit(&plan, &fit, 0..u128::MAX, key), Some(3));
//! ```

use crate::plan::{JobFit, Plan};
use std::ops::Range;

/// A node's key in a [`NodeOrder`]: an unsigned integer whose low 32 bits
/// are the node's index.
pub trait OrderKey: Copy + Ord + std::fmt::Debug {
    /// The node the key names (its low 32 bits).
    fn node(self) -> u32;
}

impl OrderKey for u128 {
    #[inline]
    fn node(self) -> u32 {
        self as u32
    }
}

impl OrderKey for u64 {
    #[inline]
    fn node(self) -> u32 {
        self as u32
    }
}

/// The nodes in a policy's order; see the module docs.
#[derive(Clone, Debug, Default)]
pub struct NodeOrder<K: OrderKey = u128> {
    /// Every node's key when the order was built, sorted.
    base: Vec<K>,
    /// The current keys of the nodes whose key differs from their base entry, sorted.
    moved: Vec<K>,
    /// Per node: its current key.
    key: Vec<K>,
    /// Per node: its key in `base`.
    base_key: Vec<K>,
    /// Nodes re-keyed before every query: those handed out for the job of
    /// the last query (a later worker of the same gang sees them charged,
    /// and the next job sees them charged or, if the gang did not fit and was
    /// rolled back, released again) and those [`NodeOrder::touch`]ed.
    touched: Vec<u32>,
    /// The job of the last query.
    touched_for: Option<u32>,
    /// `moved` is merged into `base` when it grows past this (√nodes, at least 64).
    merge_at: usize,
}

/// Nodes a query walks past before it finishes with a scan.
pub const WALK_BUDGET: usize = 256;

/// The node a key names (its low 32 bits).
pub fn key_node<K: OrderKey>(key: K) -> u32 {
    key.node()
}

impl<K: OrderKey> NodeOrder<K> {
    /// Nodes `0..nodes` in the order of `key(node)`.
    pub fn new(nodes: u32, key: impl Fn(u32) -> K) -> Self {
        let keys: Vec<K> = (0..nodes).map(&key).collect();
        let mut base = keys.clone();
        base.sort_unstable();
        NodeOrder {
            base,
            moved: Vec::new(),
            base_key: keys.clone(),
            key: keys,
            touched: Vec::new(),
            touched_for: None,
            merge_at: (nodes as usize).isqrt().max(64),
        }
    }

    /// Merge the moved keys into the base: the base's stale entries out, the
    /// moved keys in their place, in one pass over both sorted arrays.
    fn merge_moved(&mut self) {
        let mut merged = Vec::with_capacity(self.base.len());
        let mut moved = self.moved.iter().copied().peekable();
        for &k in &self.base {
            let n = key_node(k) as usize;
            if self.key[n] != k {
                continue; // stale: its node's current key is in `moved`
            }
            while let Some(m) = moved.next_if(|&m| m < k) {
                merged.push(m);
            }
            merged.push(k);
        }
        merged.extend(moved);
        for &k in &self.moved {
            self.base_key[key_node(k) as usize] = k;
        }
        self.base = merged;
        self.moved.clear();
    }

    /// Re-key `node` before the next query: the plan charged or released it
    /// through another order.
    pub fn touch(&mut self, node: u32) {
        if !self.touched.contains(&node) {
            self.touched.push(node);
        }
    }

    fn refresh(&mut self, node: u32, new: K) {
        let n = node as usize;
        let old = self.key[n];
        if old == new {
            return;
        }
        if old != self.base_key[n]
            && let Ok(at) = self.moved.binary_search(&old)
        {
            self.moved.remove(at);
        }
        if new != self.base_key[n] {
            let at = self.moved.partition_point(|&k| k < new);
            self.moved.insert(at, new);
        }
        self.key[n] = new;
    }

    /// The first node in key order, its key in `range`, where one worker of
    /// `fit` fits under `plan`; `key` is the order's key function (as given
    /// to [`NodeOrder::new`]), read for the nodes that may have moved.
    pub fn first_fit(
        &mut self,
        plan: &Plan<'_>,
        fit: &JobFit,
        range: Range<K>,
        key: impl Fn(u32) -> K,
    ) -> Option<u32> {
        self.first_fit_skipping(plan, fit, range, key, |_| None)
    }

    /// [`NodeOrder::first_fit`], jumping over runs of keys that cannot fit:
    /// for the key of a node that did not fit, `skip(key)` may name a larger
    /// key such that no node keyed in between fits either, and the walk goes
    /// on from there by binary search. An order keyed by several resources
    /// uses it to pass, in one step, the nodes that have enough of the first
    /// but too little of the next (best-fit: the nodes with this much free
    /// GPU but less free CPU than the worker asks). Without it such a walk
    /// passes them one by one, and there are as many of them as the cluster
    /// is large.
    pub fn first_fit_skipping(
        &mut self,
        plan: &Plan<'_>,
        fit: &JobFit,
        range: Range<K>,
        key: impl Fn(u32) -> K,
        skip: impl Fn(K) -> Option<K>,
    ) -> Option<u32> {
        for i in 0..self.touched.len() {
            let node = self.touched[i];
            self.refresh(node, key(node));
        }
        if self.touched_for != Some(fit.job) {
            self.touched.clear();
            self.touched_for = Some(fit.job);
        }
        if self.moved.len() > self.merge_at {
            self.merge_moved();
        }
        let mut b = self.base.partition_point(|&k| k < range.start);
        let mut m = self.moved.partition_point(|&k| k < range.start);
        let mut walked = 0;
        let node = loop {
            if walked == WALK_BUDGET {
                // Every node's key is current here (the moved ones were
                // re-keyed above): the least in range among the fitting.
                let mut best: Option<K> = None;
                plan.each_fitting_node(fit, |n| {
                    let k = self.key[n as usize];
                    if range.contains(&k) && best.is_none_or(|b| k < b) {
                        best = Some(k);
                    }
                });
                break key_node(best?);
            }
            let (k, from_base) = match (self.base.get(b), self.moved.get(m)) {
                (Some(&kb), Some(&km)) if kb < km => (kb, true),
                (_, Some(&km)) => (km, false),
                (Some(&kb), None) => (kb, true),
                (None, None) => return None,
            };
            if k >= range.end {
                return None;
            }
            if from_base {
                b += 1;
                // The node has moved: its current key is in `moved`.
                if self.key[key_node(k) as usize] != k {
                    continue;
                }
            } else {
                m += 1;
            }
            let node = key_node(k);
            if plan.fits(fit, node) {
                break node;
            }
            walked += 1;
            if let Some(next) = skip(k).filter(|&next| next > k) {
                b += self.base[b..].partition_point(|&x| x < next);
                m += self.moved[m..].partition_point(|&x| x < next);
            }
        };
        self.touch(node);
        Some(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestCluster;

    /// Past the walk budget the query finishes with a scan and gives the
    /// walk's answer: the least key in range among the fitting nodes.
    #[test]
    fn a_long_walk_finishes_with_the_same_answer_by_a_scan() {
        let mut c = TestCluster::new();
        let small = 3 * WALK_BUDGET as u32;
        for n in 0..small {
            c.node(&format!("small-{n}"), "p", 64_000, 256_000, "T4", 16_384, 1);
        }
        let big_a = c.node("big-a", "p", 64_000, 256_000, "T4", 16_384, 8);
        let big_b = c.node("big-b", "p", 64_000, 256_000, "T4", 16_384, 8);
        let eight = c.job("eight", "t", 1, 8);
        let sixteen = c.job("sixteen", "t", 1, 16);
        let one = c.job("one", "t", 1, 1);
        let plan = Plan::new(c.cluster());
        let key = |n: u32| u128::from(n);
        let nodes = c.cluster().node_count() as u32;
        let mut order = NodeOrder::new(nodes, key);
        let fit = plan.job_fit(eight);
        assert_eq!(order.first_fit(&plan, &fit, 0..u128::MAX, key), Some(big_a));
        let past_a = u128::from(big_a) + 1;
        assert_eq!(
            order.first_fit(&plan, &fit, past_a..u128::MAX, key),
            Some(big_b)
        );
        assert_eq!(
            order.first_fit(&plan, &fit, 0..u128::from(big_a), key),
            None
        );
        let fit = plan.job_fit(sixteen);
        assert_eq!(order.first_fit(&plan, &fit, 0..u128::MAX, key), None);
        let fit = plan.job_fit(one);
        assert_eq!(order.first_fit(&plan, &fit, 0..u128::MAX, key), Some(0));
    }

    /// Past √nodes moved keys the order merges them into its base; walking it
    /// then still lists every node once, in the current keys' order — keys
    /// moved below, between and beyond the base's alike.
    #[test]
    fn moved_keys_merged_into_the_base_keep_the_order() {
        use std::cell::RefCell;
        let mut c = TestCluster::new();
        let nodes = 200u32;
        for n in 0..nodes {
            c.node(&format!("n{n}"), "p", 64_000, 256_000, "T4", 16_384, 1);
        }
        let job = c.job("one", "t", 1, 1);
        let plan = Plan::new(c.cluster());
        let fit = plan.job_fit(job);
        let table = RefCell::new(
            (0..nodes)
                .map(|n| u128::from(n + 1000) << 32 | u128::from(n))
                .collect::<Vec<_>>(),
        );
        let key = |n: u32| table.borrow()[n as usize];
        let mut order = NodeOrder::new(nodes, key);
        // 120 nodes move: to the front, into the middle, past the end.
        for n in (0..nodes)
            .step_by(5)
            .chain((1..nodes).step_by(5))
            .chain((2..nodes).step_by(5))
        {
            let upper = match n % 3 {
                0 => 0,
                1 => 1000 + (nodes - n),
                _ => 5000 + n,
            };
            table.borrow_mut()[n as usize] = (u128::from(upper) << 32) | u128::from(n);
            order.touch(n);
        }
        let mut listed = Vec::new();
        let mut from = 0u128;
        while let Some(n) = order.first_fit(&plan, &fit, from..u128::MAX, key) {
            listed.push(n);
            from = key(n) + 1;
        }
        assert!(order.moved.is_empty(), "the moved keys were merged");
        let mut expected: Vec<u32> = (0..nodes).collect();
        expected.sort_by_key(|&n| key(n));
        assert_eq!(listed, expected);
    }
}
