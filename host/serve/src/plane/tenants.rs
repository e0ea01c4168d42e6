//! Tenants: adding, removing, their tokens and quotas.

use super::*;

impl Plane {
    pub fn add_tenant(
        &mut self,
        caller: &Caller,
        name: &str,
        quota_gpus: u32,
    ) -> Result<(String, Ack), ApiError> {
        Self::require_admin(caller)?;
        if name.is_empty()
            || name.len() > 63
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(ApiError::InvalidArgument(
                "tenant name must be 1..=63 of [A-Za-z0-9_-]".into(),
            ));
        }
        if name == DEFAULT_TENANT {
            // It would inherit every job submitted without a tenant.
            return Err(ApiError::InvalidArgument(format!(
                "`{DEFAULT_TENANT}` is reserved for jobs submitted without a tenant"
            )));
        }
        if self.tenants.contains_key(name) {
            return Err(ApiError::AlreadyExists(format!("tenant `{name}` exists")));
        }
        let token = new_token();
        let record = TenantRecord {
            name: name.to_string(),
            quota_gpus,
            token_sha256: sha256_hex(token.as_bytes()),
        };
        let bytes = serde_json::to_vec(&record).map_err(internal)?;
        let ack = self
            .writer
            .send_durable(vec![Write::Put(format!("tenant/{name}"), bytes)]);
        self.tenants.insert(name.to_string(), record);
        for cell in &mut self.cells {
            if let Err(e) = cell
                .state
                .set_tenant_quota(name, (quota_gpus > 0).then_some(quota_gpus))
            {
                tracing::error!(tenant = name, error = %e, "tenant quota not applied");
            }
        }
        Ok((token, ack))
    }

    /// Removes a tenant that has no live job: its record, its token, its
    /// policy slot. Its ended jobs stay (as history, until retention).
    pub fn remove_tenant(&mut self, caller: &Caller, name: &str) -> Result<Ack, ApiError> {
        Self::require_admin(caller)?;
        if !self.tenants.contains_key(name) {
            return Err(ApiError::NotFound(format!("no tenant `{name}`")));
        }
        let live = self
            .jobs
            .values()
            .filter(|j| j.tenant == name && !j.status.is_terminal())
            .count();
        if live > 0 {
            return Err(ApiError::FailedPrecondition(format!(
                "tenant `{name}` has {live} live jobs; cancel them first"
            )));
        }
        if self
            .experiment
            .as_ref()
            .is_some_and(|e| e.record.candidate_tenants.iter().any(|t| t == name))
        {
            return Err(ApiError::FailedPrecondition(format!(
                "tenant `{name}` is an arm of the running experiment"
            )));
        }
        self.tenants.remove(name);
        let slot = tenant_slot(name);
        self.registry.remove(&slot);
        self.tenant_memory.remove(name);
        for cell in &mut self.cells {
            if let Err(e) = cell.state.set_tenant_quota(name, None) {
                tracing::error!(tenant = name, error = %e, "tenant quota not cleared");
            }
        }
        tracing::info!(tenant = name, "tenant removed");
        Ok(self.writer.send_durable(vec![
            Write::Delete(format!("tenant/{name}")),
            Write::Delete(format!("slot/{slot}")),
        ]))
    }

    /// A new token for `subject` ("admin", "node" or `tenant:<name>`); the
    /// old one stops working at once. The admin's and the nodes' are also
    /// written to their files in the data directory.
    pub fn rotate_token(
        &mut self,
        caller: &Caller,
        subject: &str,
    ) -> Result<(String, Ack), ApiError> {
        Self::require_admin(caller)?;
        let token = new_token();
        let sha = sha256_hex(token.as_bytes());
        let write = match subject {
            "admin" | "node" => {
                let path = self.data.join(format!("{subject}.token"));
                crate::files::write(&path, format!("{token}\n").as_bytes(), true)
                    .map_err(internal)?;
                if subject == "admin" {
                    self.admin_token_sha = sha.clone();
                } else {
                    self.node_token_sha = sha.clone();
                }
                Write::Put(format!("meta/{subject}_token_sha256"), sha.into_bytes())
            }
            _ if subject.starts_with("node:") => {
                // A token for one node: it registers under that name only.
                let name = &subject["node:".len()..];
                check_node_name(name).map_err(ApiError::InvalidArgument)?;
                self.node_tokens.insert(name.to_string(), sha.clone());
                Write::Put(format!("{NODE_TOKEN_PREFIX}{name}"), sha.into_bytes())
            }
            _ => {
                let name = subject.strip_prefix("tenant:").ok_or_else(|| {
                    ApiError::InvalidArgument(format!(
                        "rotate whose token? `admin`, `node`, `node:<name>` or `tenant:<name>`, \
                         not `{subject}`"
                    ))
                })?;
                let record = self
                    .tenants
                    .get_mut(name)
                    .ok_or_else(|| ApiError::NotFound(format!("no tenant `{name}`")))?;
                record.token_sha256 = sha;
                let bytes = serde_json::to_vec(record).map_err(internal)?;
                Write::Put(format!("tenant/{name}"), bytes)
            }
        };
        tracing::info!(subject, "token rotated");
        Ok((token, self.writer.send_durable(vec![write])))
    }

    /// What `list_tenants` shows of tenant `name`, holding `gpus_in_use`.
    pub(super) fn tenant_view(&self, name: &str, gpus_in_use: u32) -> views::TenantView {
        let quota = self.tenants.get(name).map_or(0, |t| t.quota_gpus);
        let slot = tenant_slot(name);
        views::TenantView {
            name: name.to_string(),
            quota_gpus: quota,
            gpus_in_use,
            policy_slot: if self
                .registry
                .find(&slot)
                .is_some_and(|s| s.active().is_some())
            {
                slot
            } else {
                String::new()
            },
        }
    }
}
