//! Scenario files: the format (`types`), how files and folders of them are read (`load`), and the model-config
//! overrides a bundled engine may carry (`engine_config`).

pub mod engine_config;
mod load;
mod types;

pub use load::{collect_files, load_file, load_paths, load_str, ScenarioError};
pub use types::{Assertions, BoundaryParams, CaseName, EngineSpec, Kind, Params, Scenario, StressParams};
pub use types::{GrowthParams, StalenessParams, MAX_TOKENS, MAX_TURNS, MAX_USER_LEN};
