//! `top`: the cluster at a glance (policy, jobs, nodes, services).

use super::jobs::{list_all_jobs, service_json, service_text};
use super::nodes::{node_json, print_node_table};
use super::{Conn, connect, parse_watch, print_json, status_error};
use arbiter_proto::v1;
use clap::Args;
use std::time::Duration;

#[derive(Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Refresh this often until interrupted (e.g. `2s`; at least 100ms).
    #[arg(long, value_parser = parse_watch)]
    pub watch: Option<Duration>,
}

pub async fn top(conn: &Conn) -> anyhow::Result<()> {
    let mut c = connect(conn).await?;
    let view = c
        .cluster
        .view(v1::ClusterViewRequest {})
        .await
        .map_err(status_error)?
        .into_inner();
    let nodes = c
        .nodes
        .list(v1::ListNodesRequest {})
        .await
        .map_err(status_error)?
        .into_inner()
        .nodes;
    // Running services and their load: what an autoscaling policy acts on.
    let services: Vec<v1::Job> = list_all_jobs(
        &mut c,
        v1::ListJobsRequest {
            states: vec![v1::JobState::Running as i32],
            ..Default::default()
        },
    )
    .await?
    .into_iter()
    .filter(|j| j.spec.as_ref().is_some_and(|s| s.kind == 1))
    .collect();
    if conn.json {
        return print_json(&serde_json::json!({
            "epoch": view.epoch, "rounds": view.rounds, "nodes": view.nodes, "gpus": view.gpus,
            "gpu_allocation_pct": view.gpu_allocation_pct,
            "jobs": {"queued": view.jobs_queued, "pending": view.jobs_pending,
                     "running": view.jobs_running, "finished": view.jobs_finished},
            "policy": view.active_policy, "generation": view.active_generation,
            "experiment": view.experiment,
            "quarantined": view.quarantined.iter().map(|q| serde_json::json!({
                "slot": q.slot, "generation": q.generation, "name": q.name,
                "faults": q.faults, "last_fault": q.last_fault, "active": q.active,
            })).collect::<Vec<_>>(),
            "node_list": nodes.iter().map(node_json).collect::<Vec<_>>(),
            "services": services.iter().map(|j| serde_json::json!({
                "id": j.id, "name": j.spec.as_ref().map(|s| s.name.clone()),
                "replicas": j.workers, "slo_ms": j.spec.as_ref().map_or(0, |s| s.slo_ms),
                "load": j.service.as_ref().map(service_json),
            })).collect::<Vec<_>>(),
        }));
    }
    println!(
        "policy {} (gen {}){}  rounds {}  GPUs {} allocated {:.1}%",
        view.active_policy,
        view.active_generation,
        if view.experiment.is_empty() {
            String::new()
        } else {
            format!("  experiment {}", view.experiment)
        },
        view.rounds,
        view.gpus,
        view.gpu_allocation_pct
    );
    println!(
        "jobs: {} queued, {} pending, {} running, {} finished",
        view.jobs_queued, view.jobs_pending, view.jobs_running, view.jobs_finished
    );
    for q in &view.quarantined {
        println!(
            "QUARANTINED slot {} gen {} ({}): {} faults{}{}",
            q.slot,
            q.generation,
            q.name,
            q.faults,
            if q.active {
                "; still active, the native policy serves the slot"
            } else {
                ""
            },
            if q.last_fault.is_empty() {
                String::new()
            } else {
                format!("; last: {}", q.last_fault)
            }
        );
    }
    print_node_table(&nodes);
    if !services.is_empty() {
        println!("{:>6} {:<24} {:>8} LOAD", "SERVICE", "NAME", "REPLICAS");
        for j in &services {
            let name = j.spec.as_ref().map_or("", |s| s.name.as_str());
            let load = service_text(j);
            let load = if load.is_empty() {
                "no report yet".to_string()
            } else {
                load
            };
            println!("{:>6} {:<24} {:>8} {}", j.id, name, j.workers, load);
        }
    }
    Ok(())
}
