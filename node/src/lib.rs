//! Node enforcer (see ARCHITECTURE.md).
