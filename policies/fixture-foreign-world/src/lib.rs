//! Test fixture: a perfectly good component that is not a policy.
#![cfg(target_arch = "wasm32")]

wit_bindgen::generate!({ path: "wit", world: "counter-world" });

struct Counter;

impl exports::example::unrelated::counter::Guest for Counter {
    fn next() -> u32 {
        42
    }
}

export!(Counter);
