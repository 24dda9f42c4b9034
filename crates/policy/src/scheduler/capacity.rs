//! What a request consumes from a capacity: the request policy's rounding and its checks, as the
//! scheduler's allocator applies them (KEP-5075, consumable capacity).
//!
//! - No amount requested: the policy's `default`, or without one the whole capacity.
//! - An amount and no policy: exactly that amount.
//! - A range: below `min` becomes `min`; with a `step`, rounded up to `min + k * step`.
//! - A list of valid values: rounded up to the first value at least as large; above the largest
//!   it stays as asked, and then violates the policy.
//!
//! The allocator then refuses the device (it tries another one) when the rounded amount violates
//! the policy (above `max`, off the step, not in the list; the `default` always passes) or when
//! it does not fit in what the device has left. Arithmetic is exact in thousandths, which is
//! what the allocator's decimal path computes for every policy we publish (whole-unit
//! `min`/`step`: 2500m with `min 1, step 1` becomes 3).

use crate::{
    model::{Capacity, RequestPolicy, ValidValues},
    quantity::Quantity,
};

/// The amount a request consumes from `capacity`, given what it asked for.
pub fn consumed(requested: Option<Quantity>, capacity: &Capacity) -> Quantity {
    let Some(requested) = requested else {
        return capacity
            .request_policy
            .as_ref()
            .and_then(|p| p.default)
            .unwrap_or(capacity.value);
    };
    let Some(policy) = &capacity.request_policy else {
        return requested;
    };
    match &policy.valid {
        ValidValues::Range { min, step, .. } => {
            if requested < *min {
                return *min;
            }
            match step {
                Some(step) if step.milli() > 0 => {
                    let over = requested.milli() - min.milli();
                    let steps = over.div_ceil(step.milli());
                    Quantity::from_milli(
                        steps
                            .saturating_mul(step.milli())
                            .saturating_add(min.milli()),
                    )
                }
                _ => requested,
            }
        }
        ValidValues::Values(values) => values
            .iter()
            .find(|v| requested <= **v)
            .copied()
            .unwrap_or(requested),
    }
}

/// Whether a (rounded) amount violates the policy: the allocator then skips the device.
pub fn violates(amount: Quantity, policy: Option<&RequestPolicy>) -> bool {
    let Some(policy) = policy else {
        return false;
    };
    if policy.default == Some(amount) {
        return false;
    }
    match &policy.valid {
        ValidValues::Range { min, max, step } => {
            if max.is_some_and(|max| amount > max) {
                return true;
            }
            match step {
                Some(step) if step.milli() > 0 => {
                    amount < *min || !(amount.milli() - min.milli()).is_multiple_of(step.milli())
                }
                _ => false,
            }
        }
        ValidValues::Values(values) => !values.contains(&amount),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        s.parse().unwrap()
    }

    fn range(default: Option<&str>, min: &str, max: Option<&str>, step: Option<&str>) -> Capacity {
        Capacity {
            value: q("8"),
            request_policy: Some(RequestPolicy {
                default: default.map(q),
                valid: ValidValues::Range {
                    min: q(min),
                    max: max.map(q),
                    step: step.map(q),
                },
            }),
        }
    }

    #[test]
    fn a_step_rounds_up_from_min() {
        // What the issue 19 trial saw: 2500m on min 1, step 1 became 3.
        let cap = range(Some("1"), "1", Some("8"), Some("1"));
        assert_eq!(consumed(Some(q("2500m")), &cap), q("3"));
        assert_eq!(consumed(Some(q("3")), &cap), q("3"));
        // Whole cores on a 2-thread machine: min 2, step 2.
        let cores = range(Some("2"), "2", Some("8"), Some("2"));
        assert_eq!(consumed(Some(q("3")), &cores), q("4"));
        assert_eq!(consumed(Some(q("4")), &cores), q("4"));
        assert_eq!(consumed(Some(q("4001m")), &cores), q("6"));
    }

    #[test]
    fn below_min_becomes_min_and_without_step_stays_as_asked() {
        let cap = range(None, "2", None, None);
        assert_eq!(consumed(Some(q("500m")), &cap), q("2"));
        assert_eq!(consumed(Some(q("2500m")), &cap), q("2500m"));
    }

    #[test]
    fn no_amount_takes_the_default_or_the_whole_capacity() {
        let cap = range(Some("1"), "1", Some("8"), Some("1"));
        assert_eq!(consumed(None, &cap), q("1"));
        let no_default = range(None, "1", Some("8"), Some("1"));
        assert_eq!(consumed(None, &no_default), q("8"));
        let no_policy = Capacity {
            value: q("6"),
            request_policy: None,
        };
        assert_eq!(consumed(None, &no_policy), q("6"));
        assert_eq!(consumed(Some(q("2500m")), &no_policy), q("2500m"));
    }

    #[test]
    fn valid_values_round_up_to_the_next_listed_value() {
        let cap = Capacity {
            value: q("8"),
            request_policy: Some(RequestPolicy {
                default: None,
                valid: ValidValues::Values(vec![q("1"), q("2"), q("4")]),
            }),
        };
        assert_eq!(consumed(Some(q("3")), &cap), q("4"));
        assert_eq!(consumed(Some(q("500m")), &cap), q("1"));
        // Above the largest it stays as asked, and then violates the policy.
        assert_eq!(consumed(Some(q("5")), &cap), q("5"));
        assert!(violates(q("5"), cap.request_policy.as_ref()));
        assert!(!violates(q("4"), cap.request_policy.as_ref()));
    }

    #[test]
    fn violations_are_above_max_and_off_the_step_but_never_the_default() {
        let cap = range(Some("1"), "1", Some("4"), Some("1"));
        let policy = cap.request_policy.as_ref();
        assert!(violates(q("5"), policy), "above max");
        assert!(violates(q("2500m"), policy), "off the step");
        assert!(!violates(q("4"), policy));
        assert!(!violates(q("6"), None), "no policy, nothing to violate");
        // A default outside the range still passes, as the allocator lets it.
        let odd = range(Some("9"), "1", Some("4"), Some("1"));
        assert!(!violates(q("9"), odd.request_policy.as_ref()));
    }
}
