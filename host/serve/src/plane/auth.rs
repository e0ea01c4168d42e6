//! Who may do what (the tokens themselves are checked on the board: `crate::board::Credentials`).

use super::*;

impl Plane {
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

/// Whether `caller` may see or change slot `slot`: the admin any, a tenant
/// its own (`tenant:<name>`) only, a node none.
pub(crate) fn check_slot_access(caller: &Caller, slot: &str) -> Result<(), ApiError> {
    match caller {
        Caller::Admin => Ok(()),
        Caller::Tenant(t) if slot == tenant_slot(t) => Ok(()),
        Caller::Tenant(t) => Err(ApiError::PermissionDenied(format!(
            "tenant `{t}` may only use its own slot `{}`",
            tenant_slot(t)
        ))),
        Caller::Node(_) => Err(node_token_refused()),
    }
}
