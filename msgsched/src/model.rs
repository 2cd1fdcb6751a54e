//! The three queueing models of Rakaia's evaluation, shared by the scheduler and the
//! simulator (one enum, so a simulated and a measured run name the same thing).

use core::fmt;
use core::str::FromStr;

/// Which queueing model: how messages of many connections meet workers.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Model {
    /// Connections partitioned: a connection's messages always go to the same worker (a
    /// FIFO per worker).
    Cp,
    /// Connections shared: any worker, but one message of a connection at a time (a FIFO
    /// per connection).
    Cs,
    /// Messages shared: any worker, any message (one logical FIFO, M/G/c).
    Ms,
}

impl Model {
    /// All models, in the order tables print them.
    pub const ALL: [Model; 3] = [Model::Cp, Model::Cs, Model::Ms];

    /// Lower-case name, as accepted by [`FromStr`].
    pub fn name(self) -> &'static str {
        match self {
            Model::Cp => "cp",
            Model::Cs => "cs",
            Model::Ms => "ms",
        }
    }
}

impl fmt::Display for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// A model name other than `cp`, `cs` or `ms` (case-insensitive).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown scheduling model {0:?} (expected cp, cs or ms)")]
pub struct ParseModelError(pub String);

impl FromStr for Model {
    type Err = ParseModelError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cp" => Ok(Model::Cp),
            "cs" => Ok(Model::Cs),
            "ms" => Ok(Model::Ms),
            _ => Err(ParseModelError(s.to_owned())),
        }
    }
}
