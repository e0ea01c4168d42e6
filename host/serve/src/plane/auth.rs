//! Who is calling: bearer tokens to callers.

use super::*;

impl Plane {
    /// Maps a bearer token to a caller.
    pub fn authenticate(&self, token: Option<&str>) -> Result<Caller, ApiError> {
        let token = token.ok_or_else(|| {
            ApiError::Unauthenticated("missing `authorization: Bearer <token>` metadata".into())
        })?;
        let sha = sha256_hex(token.as_bytes());
        if constant_time_eq(&sha, &self.admin_token_sha) {
            return Ok(Caller::Admin);
        }
        if constant_time_eq(&sha, &self.node_token_sha) {
            return Ok(Caller::Node(None));
        }
        if let Some((name, _)) = self
            .node_tokens
            .iter()
            .find(|(_, s)| constant_time_eq(s, &sha))
        {
            return Ok(Caller::Node(Some(name.clone())));
        }
        self.tenants
            .values()
            .find(|t| constant_time_eq(&t.token_sha256, &sha))
            .map(|t| Caller::Tenant(t.name.clone()))
            .ok_or_else(|| ApiError::Unauthenticated("unknown token".into()))
    }

    pub(super) fn require_admin(caller: &Caller) -> Result<(), ApiError> {
        match caller {
            Caller::Admin => Ok(()),
            Caller::Tenant(t) => Err(ApiError::PermissionDenied(format!(
                "tenant `{t}` may not do this; it needs the admin token"
            ))),
            Caller::Node(_) => Err(node_token_refused()),
        }
    }
}
