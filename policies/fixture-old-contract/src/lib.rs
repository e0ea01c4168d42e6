//! Test fixture: a component of the `policy` world of contract 0.0.9.
//! The host must refuse it with an error naming the version mismatch.
#![cfg(target_arch = "wasm32")]

wit_bindgen::generate!({ path: "wit", world: "scheduler-policy" });

use arbiter::policy::types::*;
use exports::arbiter::policy::{meta, scheduler, sync};

struct Old;

impl meta::Guest for Old {
    fn describe() -> Manifest {
        Manifest {
            name: "old-contract".into(),
            version: "0.0.9".into(),
            roles: vec!["scheduler".into()],
            description: "built against arbiter:policy@0.0.9".into(),
            default_config: String::new(),
        }
    }
    fn configure(_config: String) -> Result<(), PolicyError> {
        Ok(())
    }
}

impl sync::Guest for Old {
    fn resync(_snapshot: Snapshot) -> Result<(), PolicyError> {
        Ok(())
    }
    fn apply(_delta: Delta) -> Result<(), PolicyError> {
        Ok(())
    }
}

impl scheduler::Guest for Old {
    fn schedule(_round: RoundInfo) -> Result<Vec<Decision>, PolicyError> {
        Ok(Vec::new())
    }
}

export!(Old);
