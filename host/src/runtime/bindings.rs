//! Host-side bindings of `wit/policy.wit`, and their conversions to the SDK model.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "policy",
});

pub use arbiter::policy::types as wit;
pub use exports::arbiter::policy as roles;

mod conversions {
    use super::wit;
    arbiter_policy_sdk::wit_conversions!();
}
