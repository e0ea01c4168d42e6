//! `aryl-random-reclaim`: Aryl's scheduler with the *Random* reclaim baseline
//! of the Aryl paper (§7.1: "On-loan servers are randomly selected"). The
//! selected servers are emptied exactly as Aryl empties its own (scale-in
//! where the job keeps its base demand, preemption otherwise), so a
//! comparison isolates the selection rule.

aryl_core::reclaim_baseline!(ArylRandomReclaim = RandomReclaim, "aryl-random-reclaim");
