//! Tenants and tokens: `tenant add|ls|rm|…`, `token rotate`.

use super::{Conn, ConnOnly, connect, print_json, status_error};
use arbiter_proto::v1;
use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum TenantCommand {
    /// Create a tenant and print its token (admin).
    Add(TenantAddArgs),
    /// List tenants, quotas and use.
    Ls(ConnOnly),
    /// Remove a tenant without live jobs (admin): its token and policy go.
    Rm(TenantRefArgs),
    /// A new token for a tenant (admin); the old one stops working.
    Rotate(TenantRefArgs),
}

#[derive(Args)]
pub struct TenantRefArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The tenant.
    pub name: String,
}

#[derive(Subcommand)]
pub enum TokenCommand {
    /// A new admin or node token (admin); the old one stops working and the
    /// data directory's `admin.token`/`node.token` is rewritten. `node:NAME`
    /// issues (or replaces) a token bound to node NAME.
    Rotate(TokenRotateArgs),
}

#[derive(Args)]
pub struct TokenRotateArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Whose: `admin`, `node` (the shared node token), or `node:NAME` (a token
    /// that registers node NAME only); tenants: `tenant rotate NAME`.
    #[arg(value_parser = parse_token_subject)]
    pub subject: String,
}

fn parse_token_subject(s: &str) -> Result<String, String> {
    match s {
        "admin" | "node" => Ok(s.to_string()),
        _ if s.strip_prefix("node:").is_some_and(|n| !n.is_empty()) => Ok(s.to_string()),
        _ => Err(format!("`{s}`: one of admin, node, node:<name>")),
    }
}

async fn rotate(conn: &Conn, subject: String) -> anyhow::Result<()> {
    let mut c = connect(conn).await?;
    let t = c
        .cluster
        .rotate_token(v1::RotateTokenRequest {
            subject: subject.clone(),
        })
        .await
        .map_err(status_error)?
        .into_inner();
    if conn.json {
        print_json(&serde_json::json!({"subject": subject, "token": t.token}))
    } else {
        println!("{subject} token: {}", t.token);
        Ok(())
    }
}

pub async fn token_command(cmd: &TokenCommand) -> anyhow::Result<()> {
    match cmd {
        TokenCommand::Rotate(a) => rotate(&a.conn, a.subject.clone()).await,
    }
}

#[derive(Args)]
pub struct TenantAddArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The tenant's name (`default` is reserved for jobs without a tenant).
    pub name: String,
    /// GPUs the tenant may hold at once (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    pub quota_gpus: u32,
}

pub async fn tenant(cmd: &TenantCommand) -> anyhow::Result<()> {
    match cmd {
        TenantCommand::Rm(a) => {
            let mut c = connect(&a.conn).await?;
            c.cluster
                .remove_tenant(v1::TenantRef {
                    name: a.name.clone(),
                })
                .await
                .map_err(status_error)?;
            if a.conn.json {
                print_json(&serde_json::json!({"removed": a.name}))
            } else {
                println!("tenant {} removed", a.name);
                Ok(())
            }
        }
        TenantCommand::Rotate(a) => rotate(&a.conn, format!("tenant:{}", a.name)).await,
        TenantCommand::Add(a) => {
            let mut c = connect(&a.conn).await?;
            let t = c
                .cluster
                .add_tenant(v1::AddTenantRequest {
                    name: a.name.clone(),
                    quota_gpus: a.quota_gpus,
                })
                .await
                .map_err(status_error)?
                .into_inner();
            if a.conn.json {
                print_json(&serde_json::json!({
                    "name": t.name, "quota_gpus": t.quota_gpus, "token": t.token
                }))
            } else {
                println!(
                    "tenant {} (quota {} GPUs) token: {}",
                    t.name, t.quota_gpus, t.token
                );
                Ok(())
            }
        }
        TenantCommand::Ls(a) => {
            let mut c = connect(&a.conn).await?;
            let ts = c
                .cluster
                .list_tenants(v1::ListTenantsRequest {})
                .await
                .map_err(status_error)?
                .into_inner()
                .tenants;
            if a.conn.json {
                return print_json(
                    &ts.iter()
                        .map(|t| {
                            serde_json::json!({
                                "name": t.name, "quota_gpus": t.quota_gpus,
                                "gpus_in_use": t.gpus_in_use, "policy_slot": t.policy_slot,
                            })
                        })
                        .collect::<Vec<_>>(),
                );
            }
            println!("{:<20} {:>6} {:>6} POLICY", "TENANT", "QUOTA", "USED");
            for t in &ts {
                println!(
                    "{:<20} {:>6} {:>6} {}",
                    t.name, t.quota_gpus, t.gpus_in_use, t.policy_slot
                );
            }
            Ok(())
        }
    }
}
