//! Nodes: `nodes ls|drain|undrain|lend|reclaim`.

use super::{Conn, ConnOnly, connect, print_json, status_error};
use arbiter_policy_sdk::model;
use arbiter_proto::v1;
use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum NodesCommand {
    /// List nodes.
    Ls(ConnOnly),
    /// Stop placing new work on a node.
    Drain(DrainArgs),
    /// Undo a drain: the node takes new work again.
    Undrain(DrainArgs),
    /// Lend a node to training (its pool owns it; a reclaim takes it back).
    Lend(DrainArgs),
    /// Take on-loan nodes of a pool back through the policy's reclaim role.
    Reclaim(ReclaimArgs),
}

#[derive(Args)]
pub struct ReclaimArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The pool whose on-loan nodes are the candidates.
    #[arg(long)]
    pub pool: String,
    /// How many to take back.
    #[arg(long, default_value_t = 1)]
    pub count: u32,
}

#[derive(Args)]
pub struct DrainArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The node.
    pub name: String,
}

/// The node table `top` and `nodes ls` print.
pub(super) fn print_node_table(nodes: &[v1::NodeInfo]) {
    println!(
        "{:<16} {:<10} {:<12} {:>5} {:>5} {:<12} HEALTH",
        "NODE", "STATE", "MODEL", "GPUS", "FREE", "ARM"
    );
    for n in nodes {
        println!(
            "{:<16} {:<10} {:<12} {:>5} {:>5} {:<12} {}",
            n.name,
            n.state,
            n.gpu_model,
            n.gpus,
            n.gpus_free,
            n.arm,
            gpu_health_text(&n.gpu_health)
        );
    }
}

pub(super) fn node_json(n: &v1::NodeInfo) -> serde_json::Value {
    serde_json::json!({
        "name": n.name, "state": n.state, "gpus": n.gpus, "gpus_free": n.gpus_free,
        "arm": n.arm, "kind": n.kind, "gpu_model": n.gpu_model,
        "gpu_health": n.gpu_health, "on_loan": n.on_loan,
    })
}

/// Each GPU's health by its SysMonitor state's initial (`H` healthy, `U` unhealthy, `O`
/// overlimit, `D` disabled, `I` init), in GPU order; `-` when the node reports none.
fn gpu_health_text(health: &[u32]) -> String {
    if health.is_empty() {
        return "-".into();
    }
    health
        .iter()
        .map(|&h| match u8::try_from(h).unwrap_or(u8::MAX) {
            model::health::INIT => 'I',
            model::health::HEALTHY => 'H',
            model::health::UNHEALTHY => 'U',
            model::health::OVERLIMIT => 'O',
            model::health::DISABLED => 'D',
            _ => '?',
        })
        .collect()
}

pub async fn nodes(cmd: &NodesCommand) -> anyhow::Result<()> {
    match cmd {
        NodesCommand::Ls(a) => {
            let mut c = connect(&a.conn).await?;
            let nodes = c
                .nodes
                .list(v1::ListNodesRequest {})
                .await
                .map_err(status_error)?
                .into_inner()
                .nodes;
            if a.conn.json {
                return print_json(&nodes.iter().map(node_json).collect::<Vec<_>>());
            }
            print_node_table(&nodes);
            Ok(())
        }
        NodesCommand::Drain(a) | NodesCommand::Undrain(a) | NodesCommand::Lend(a) => {
            let mut c = connect(&a.conn).await?;
            let name = a.name.clone();
            let n = match cmd {
                NodesCommand::Lend(_) => c.nodes.lend(v1::LendNodeRequest { name }).await,
                NodesCommand::Undrain(_) => c.nodes.undrain(v1::DrainNodeRequest { name }).await,
                _ => c.nodes.drain(v1::DrainNodeRequest { name }).await,
            }
            .map_err(status_error)?
            .into_inner();
            if a.conn.json {
                return print_json(&serde_json::json!({
                    "name": n.name, "state": n.state, "gpus": n.gpus, "gpus_free": n.gpus_free,
                    "on_loan": n.on_loan,
                }));
            }
            let loan = if n.on_loan { " (on loan)" } else { "" };
            println!("node {} {}{loan}", n.name, n.state);
            Ok(())
        }
        NodesCommand::Reclaim(a) => {
            let mut c = connect(&a.conn).await?;
            let r = c
                .nodes
                .reclaim(v1::ReclaimNodesRequest {
                    pool: a.pool.clone(),
                    count: a.count,
                })
                .await
                .map_err(status_error)?
                .into_inner();
            if a.conn.json {
                return print_json(&serde_json::json!({
                    "returned": r.returned, "preempted": r.preempted,
                    "scaled_in": r.scaled_in, "slot": r.slot, "served": r.served,
                    "faults": r.faults,
                }));
            }
            let chooser = if r.served == "native" {
                "the host, smallest count first".to_string()
            } else {
                format!("slot `{}`, {} generation", r.slot, r.served)
            };
            println!(
                "returned {} (chosen by {chooser}); preempted {:?}, scaled in {:?}",
                r.returned.join(", "),
                r.preempted,
                r.scaled_in
            );
            for f in &r.faults {
                println!("  fault: {f}");
            }
            if r.served == "native" && r.faults.is_empty() {
                println!(
                    "  (no policy of slot `{}` answers reclaims: none declares the role, or those \
                     that do are quarantined; to have one choose for every cell: \
                     arbiter policy load builtin:aryl --slot reclaim)",
                    r.slot
                );
            }
            Ok(())
        }
    }
}
