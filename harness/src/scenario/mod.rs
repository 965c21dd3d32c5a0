//! Scenario files: the format (`types`, and each kind's `params`), how files and folders of them are read (`load`), and the model-config
//! overrides a bundled engine may carry (`engine_config`), an HTTP engine's declaration (`http_engine`), and the JSON schema generated from those types (`schema`).

mod check_name;
pub mod corpus;
pub mod engine_config;
pub mod http_engine;
mod load;
mod locate;
mod message;
pub mod params;
mod reuse_rule;
mod schema;
mod strict;
mod types;

pub use check_name::CheckName;
pub use http_engine::{ColdSpec, HttpApi, HttpEngine, ResetKind};
pub use load::{collect_files, fuzz_scenario, load_file, load_paths, load_str, parse_str, ScenarioError};
pub use load::{MAX_NAME_LEN, MAX_SCENARIO_BYTES};
pub use params::{BoundaryParams, CaseName, ContextName, GrowthParams, StalenessParams, StressParams};
pub use params::{MAX_TOKENS, MAX_TURNS, MAX_USER_LEN};
pub use reuse_rule::DeclaredRule;
pub use schema::schema_json;
pub use types::{Assertions, Cold, EngineSpec, Kind, Params, Scenario, Via};
