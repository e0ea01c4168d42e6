//! `aryl-scf-reclaim`: Aryl's scheduler with the *Smallest (Job) Count First*
//! reclaim baseline of the Aryl paper (§7.1: "The top-k servers that host the
//! smallest number of jobs are chosen"). The selected servers are emptied
//! exactly as Aryl empties its own, so a comparison isolates the selection
//! rule.

aryl_core::reclaim_baseline!(ArylScfReclaim = ScfReclaim, "aryl-scf-reclaim");
