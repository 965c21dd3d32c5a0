//! A panic inside one trial costs that trial, not the run. The checks and readers run over whatever an engine under
//! test sent (dumps, replies); a bug they hit on input nobody foresaw must leave an `error` record naming it, while
//! the other trials, results.jsonl and the summary are still written. The runner catches it per trial here rather
//! than in each check, so no check can take a whole run (rayon would carry the panic to the caller) down.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Run `f`; a panic becomes `Err` with its message. The caller must throw away whatever state `f` was changing
/// (the warm instance, the plan's view of it): it may be half-updated.
pub fn catch_panic<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_its_message() {
        assert_eq!(catch_panic(|| 7), Ok(7));
        let n: Vec<u8> = Vec::new();
        let got = catch_panic(|| n[3]);
        assert!(got.as_ref().is_err_and(|m| m.contains("index out of bounds")), "{got:?}");
        assert_eq!(catch_panic(|| -> u8 { panic!("{}", String::from("owned")) }), Err("owned".to_string()));
    }
}
