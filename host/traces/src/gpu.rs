//! GPU model names shared by the openb and PAI traces, and the allowed-model sets of pods.

use std::fmt;
use std::str::FromStr;

/// A GPU model as named in the traces.
///
/// The set is closed on purpose: the traces are fixed public files, and an unknown name is
/// far more likely a wrong file or a typo than a new model, so loaders report it as an
/// error instead of inventing a catch-all that would silently never match any node.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum GpuModel {
    /// openb: undisclosed model.
    G1,
    /// openb: undisclosed model (the most common openb node type).
    G2,
    /// openb: undisclosed model.
    G3,
    T4,
    P100,
    /// PAI: V100 with the memory size not published.
    V100,
    V100M16,
    V100M32,
    A10,
    /// PAI: the `MISC` bucket of assorted GPU machines.
    Misc,
}

impl GpuModel {
    /// Every model, in declaration order.
    pub const ALL: [GpuModel; 10] = [
        GpuModel::G1,
        GpuModel::G2,
        GpuModel::G3,
        GpuModel::T4,
        GpuModel::P100,
        GpuModel::V100,
        GpuModel::V100M16,
        GpuModel::V100M32,
        GpuModel::A10,
        GpuModel::Misc,
    ];

    /// The name exactly as the traces spell it.
    pub const fn as_str(self) -> &'static str {
        match self {
            GpuModel::G1 => "G1",
            GpuModel::G2 => "G2",
            GpuModel::G3 => "G3",
            GpuModel::T4 => "T4",
            GpuModel::P100 => "P100",
            GpuModel::V100 => "V100",
            GpuModel::V100M16 => "V100M16",
            GpuModel::V100M32 => "V100M32",
            GpuModel::A10 => "A10",
            GpuModel::Misc => "MISC",
        }
    }

    const fn bit(self) -> u16 {
        1 << self as u16
    }
}

impl fmt::Display for GpuModel {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// The error for a string that names no [`GpuModel`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown GPU model `{0}`")]
pub struct UnknownGpuModel(pub String);

impl FromStr for GpuModel {
    type Err = UnknownGpuModel;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        GpuModel::ALL
            .into_iter()
            .find(|model| model.as_str() == name)
            .ok_or_else(|| UnknownGpuModel(name.to_string()))
    }
}

/// The GPU models a pod may run on (`gpu_spec`), as a bit set: `Copy`, and a placement
/// check is one AND.
///
/// The empty set means "any model", as in the trace. Duplicates in the source list
/// (`V100M16|V100M32|V100M32` occurs in the gpuspec variants) collapse naturally.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct GpuModelSet(u16);

impl GpuModelSet {
    /// The unconstrained set: every model is allowed.
    pub const ANY: GpuModelSet = GpuModelSet(0);

    /// Whether no constraint was given.
    pub const fn is_any(self) -> bool {
        self.0 == 0
    }

    /// Whether a GPU of `model` satisfies the constraint.
    pub const fn allows(self, model: GpuModel) -> bool {
        self.is_any() || self.0 & model.bit() != 0
    }

    /// Adds `model` to the listed models.
    pub fn insert(&mut self, model: GpuModel) {
        self.0 |= model.bit();
    }

    /// Whether `model` is explicitly listed (false for [`GpuModelSet::ANY`]).
    pub const fn contains(self, model: GpuModel) -> bool {
        self.0 & model.bit() != 0
    }

    /// The explicitly listed models, in [`GpuModel::ALL`] order (none for `ANY`).
    pub fn iter(self) -> impl Iterator<Item = GpuModel> {
        GpuModel::ALL
            .into_iter()
            .filter(move |model| self.contains(*model))
    }

    /// Parses a `|`-separated list; the empty string is [`GpuModelSet::ANY`].
    pub fn parse(list: &str) -> Result<Self, UnknownGpuModel> {
        let mut set = GpuModelSet::ANY;
        if list.is_empty() {
            return Ok(set);
        }
        for name in list.split('|') {
            set.insert(name.parse()?);
        }
        Ok(set)
    }
}

impl FromIterator<GpuModel> for GpuModelSet {
    fn from_iter<I: IntoIterator<Item = GpuModel>>(models: I) -> Self {
        let mut set = GpuModelSet::ANY;
        for model in models {
            set.insert(model);
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for model in GpuModel::ALL {
            assert_eq!(model.as_str().parse::<GpuModel>(), Ok(model));
        }
        assert!("V100M64".parse::<GpuModel>().is_err());
    }

    #[test]
    fn model_set_semantics() {
        let any = GpuModelSet::parse("").unwrap();
        assert!(any.is_any() && GpuModel::ALL.iter().all(|m| any.allows(*m)));
        let set = GpuModelSet::parse("V100M16|V100M32|V100M32").unwrap();
        assert_eq!(
            set.iter().collect::<Vec<_>>(),
            [GpuModel::V100M16, GpuModel::V100M32]
        );
        assert!(set.allows(GpuModel::V100M32) && !set.allows(GpuModel::T4));
        assert!(GpuModelSet::parse("T4|").is_err());
    }
}
