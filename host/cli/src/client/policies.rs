//! Policies on a running plane: `policy load|swap|rollback|unload|describe|ls --server`.

use super::{Conn, connect, print_json, status_error};
use anyhow::bail;
use arbiter_proto::v1;
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum RemotePolicy {
    /// Upload a component into a slot (default: the slot named by its manifest;
    /// with a tenant token, the tenant's own slot).
    Load(LoadArgs),
    /// Make a loaded generation the active one.
    Swap(SwapArgs),
    /// Go back to the previous healthy generation (or `--to` one).
    Rollback(RollbackArgs),
    /// Remove a generation from a slot, or (without `--generation`) every
    /// generation and the slot: e.g. `policy unload matcher` stops pairing.
    Unload(UnloadArgs),
    /// A slot's generations, manifests, faults and configuration.
    Describe(DescribeArgs),
    /// A slot's rounds, fallbacks and latency.
    Stats(DescribeArgs),
}

#[derive(Args)]
pub struct LoadArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The `.wasm` component, or a built-in policy's name (`builtin:<name>` whatever files
    /// exist).
    pub file: String,
    /// Slot to load into (`default`: the scheduler the plane runs). Without
    /// it: the slot named by the component's manifest — `matcher` for a pure
    /// matcher, `reclaim` for a pure reclaim policy.
    #[arg(long)]
    pub slot: Option<String>,
    /// Load into the calling tenant's own slot (`tenant:<name>`).
    #[arg(long)]
    pub tenant: bool,
    /// Configuration file (TOML) for the policy.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Load without activating.
    #[arg(long)]
    pub inactive: bool,
}

#[derive(Args)]
pub struct SwapArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The slot whose active generation changes.
    pub slot: String,
    /// The generation to activate (`policy describe` lists them).
    pub generation: u64,
}

#[derive(Args)]
pub struct RollbackArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The slot to roll back.
    pub slot: String,
    /// The generation to return to (default: the one active before; never a
    /// quarantined one).
    #[arg(long)]
    pub to: Option<u64>,
}

#[derive(Args)]
pub struct UnloadArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The slot to unload from.
    pub slot: String,
    /// The generation to remove (default: all of them, and the slot).
    #[arg(long)]
    pub generation: Option<u64>,
}

#[derive(Args)]
pub struct DescribeArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The slot to describe.
    pub slot: String,
}

fn gen_json(g: &v1::GenerationInfo) -> serde_json::Value {
    serde_json::json!({
        "id": g.id, "name": g.name, "version": g.version, "digest": g.digest,
        "roles": g.roles, "active": g.active, "quarantined": g.quarantined,
        "rounds_served": g.rounds_served, "faults": g.faults,
        "last_fault": g.last_fault, "config": g.config,
    })
}

fn print_slot(s: &v1::SlotInfo, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(&serde_json::json!({
            "slot": s.slot,
            "generations": s.generations.iter().map(gen_json).collect::<Vec<_>>(),
        }));
    }
    println!("slot {}", s.slot);
    // SERVED: the calls a generation answered — a scheduling slot's rounds,
    // or a role or tenant slot's answers (`rounds_served` counts both).
    println!(
        "  {:>4} {:<22} {:<9} {:<14} {:>8} {:>7} STATE",
        "GEN", "NAME", "VERSION", "DIGEST", "SERVED", "FAULTS"
    );
    for g in &s.generations {
        let state = match (g.active, g.quarantined) {
            (true, _) => "active",
            (false, true) => "quarantined",
            _ => "",
        };
        println!(
            "  {:>4} {:<22} {:<9} {:<14} {:>8} {:>7} {}",
            g.id,
            g.name,
            g.version,
            &g.digest[..12.min(g.digest.len())],
            g.rounds_served,
            g.faults,
            state
        );
        println!("       roles: {}", g.roles.join(", "));
        if g.config.trim().is_empty() {
            println!("       config: (the manifest's default)");
        } else {
            for (i, line) in g.config.lines().enumerate() {
                let label = if i == 0 { "config:" } else { "       " };
                println!("       {label} {line}");
            }
        }
        if g.quarantined {
            println!("       quarantined: not asked any more, and never rolled back to");
        }
        if !g.last_fault.is_empty() {
            println!("       last fault: {}", g.last_fault);
        }
    }
    Ok(())
}

pub async fn remote_policy(cmd: &RemotePolicy) -> anyhow::Result<()> {
    match cmd {
        RemotePolicy::Load(a) => {
            let wasm = arbiter_repro::read_policy(&a.file)?;
            let config = match &a.config {
                Some(p) => arbiter_host::files::read_config(p)?,
                None => String::new(),
            };
            if a.tenant && a.slot.is_some() {
                bail!("--tenant and --slot are exclusive");
            }
            let mut c = connect(&a.conn).await?;
            let loaded = c
                .policies
                .upload(v1::UploadPolicyRequest {
                    slot: a.slot.clone().unwrap_or_default(),
                    wasm,
                    config,
                    activate: !a.inactive,
                })
                .await
                .map_err(status_error)?
                .into_inner();
            let g = loaded.generation.unwrap_or_default();
            if a.conn.json {
                let mut json = gen_json(&g);
                json["slot"] = serde_json::Value::String(loaded.slot);
                print_json(&json)
            } else {
                println!(
                    "loaded {} {} into slot `{}` as generation {}{} (digest {})",
                    g.name,
                    g.version,
                    loaded.slot,
                    g.id,
                    if g.active { ", active" } else { "" },
                    &g.digest[..12.min(g.digest.len())]
                );
                Ok(())
            }
        }
        RemotePolicy::Swap(a) => {
            let mut c = connect(&a.conn).await?;
            let s = c
                .policies
                .swap(v1::SwapPolicyRequest {
                    slot: a.slot.clone(),
                    generation: a.generation,
                })
                .await
                .map_err(status_error)?
                .into_inner();
            print_slot(&s, a.conn.json)
        }
        RemotePolicy::Rollback(a) => {
            let mut c = connect(&a.conn).await?;
            let s = c
                .policies
                .rollback(v1::RollbackPolicyRequest {
                    slot: a.slot.clone(),
                    generation: a.to.unwrap_or(0),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            print_slot(&s, a.conn.json)
        }
        RemotePolicy::Unload(a) => {
            let mut c = connect(&a.conn).await?;
            let s = c
                .policies
                .unload(v1::UnloadPolicyRequest {
                    slot: a.slot.clone(),
                    generation: a.generation.unwrap_or(0),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            if s.generations.is_empty() && !a.conn.json {
                println!("slot {} unloaded: it is empty and gone", s.slot);
                return Ok(());
            }
            print_slot(&s, a.conn.json)
        }
        RemotePolicy::Describe(a) => {
            let mut c = connect(&a.conn).await?;
            let s = c
                .policies
                .describe(v1::SlotRef {
                    slot: a.slot.clone(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            print_slot(&s, a.conn.json)
        }
        RemotePolicy::Stats(a) => {
            let mut c = connect(&a.conn).await?;
            let s = c
                .policies
                .stats(v1::SlotRef {
                    slot: a.slot.clone(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            if a.conn.json {
                return print_json(&serde_json::json!({
                    "slot": s.slot, "cells": s.cells, "rounds": s.rounds, "fallbacks": s.fallbacks,
                    "latency_p50_ms": s.latency_p50_ms, "latency_p99_ms": s.latency_p99_ms,
                    "generations": s.generations.iter().map(gen_json).collect::<Vec<_>>(),
                }));
            }
            if s.cells == 0 {
                // A role slot or a tenant's: no rounds of its own to time.
                println!(
                    "slot {}: runs no cell's rounds; answers by generation:",
                    s.slot
                );
                for g in &s.generations {
                    println!(
                        "  {:>4} {:<22} {} answered, {} faults{}",
                        g.id,
                        g.name,
                        g.rounds_served,
                        g.faults,
                        if g.active { " (active)" } else { "" }
                    );
                }
                return Ok(());
            }
            println!(
                "slot {}: {} rounds, {} fallbacks, policy latency p50 {:.3} ms p99 {:.3} ms",
                s.slot, s.rounds, s.fallbacks, s.latency_p50_ms, s.latency_p99_ms
            );
            Ok(())
        }
    }
}

pub async fn remote_ls(conn: &Conn) -> anyhow::Result<()> {
    let mut c = connect(conn).await?;
    let slots = c
        .policies
        .list(v1::ListPoliciesRequest {})
        .await
        .map_err(status_error)?
        .into_inner()
        .slots;
    if conn.json {
        return print_json(
            &slots
                .iter()
                .map(|s| {
                    serde_json::json!({
                        "slot": s.slot,
                        "generations": s.generations.iter().map(gen_json).collect::<Vec<_>>(),
                    })
                })
                .collect::<Vec<_>>(),
        );
    }
    for s in &slots {
        print_slot(s, false)?;
    }
    Ok(())
}
