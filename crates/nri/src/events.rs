//! Event subscriptions and the mask negotiated in Configure (reference §4.2).
//!
//! Owns the bit layout (event `e` is bit `e - 1`; `1 << e` is a known bug elsewhere) and the rule
//! that we never send a bit the runtime's NRI version does not know: such a bit fails Configure
//! and the runtime drops the plugin.

use std::fmt;

use crate::{api::Event, version::NriVersion};

/// The mask every runtime accepts (events 1 to 11; `LAST` was 12 before NRI v0.10).
pub const VALID_MASK_BEFORE_V0_10: u32 = 0x7FF;
/// The mask runtimes on NRI v0.10 and later accept (events 1 to 14).
pub const VALID_MASK_SINCE_V0_10: u32 = 0x3FFF;

/// A set of events, stored as the wire mask.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct EventSet(u32);

impl EventSet {
    pub const fn empty() -> Self {
        Self(0)
    }

    /// The set of the given events; `UNKNOWN` and `LAST` are not events and are ignored.
    pub fn of(events: &[Event]) -> Self {
        events.iter().fold(Self::empty(), |s, &e| s.with(e))
    }

    /// This set plus `event`.
    #[must_use]
    pub fn with(self, event: Event) -> Self {
        Self(self.0 | bit(event))
    }

    pub fn contains(self, event: Event) -> bool {
        let b = bit(event);
        b != 0 && self.0 & b == b
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The wire mask: bit `e - 1` for event `e`.
    pub fn mask(self) -> u32 {
        self.0
    }

    /// The events in this set, in numeric order.
    pub fn iter(self) -> impl Iterator<Item = Event> {
        (1..Event::Last as i32)
            .filter_map(|n| Event::try_from(n).ok())
            .filter(move |&e| self.contains(e))
    }

    /// The subset a runtime on `runtime` (None: unknown) can deliver, and the part it cannot.
    pub fn split_for(self, runtime: Option<NriVersion>) -> (EventSet, EventSet) {
        let valid = valid_mask(runtime);
        (Self(self.0 & valid), Self(self.0 & !valid))
    }
}

impl fmt::Debug for EventSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.iter().map(|e| e.as_str_name()))
            .finish()
    }
}

/// The events a runtime on NRI `runtime` accepts in a subscription. An unknown version gets the
/// mask every runtime accepts.
pub fn valid_mask(runtime: Option<NriVersion>) -> u32 {
    match runtime {
        Some(v) if v >= NriVersion::new(0, 10, 0) => VALID_MASK_SINCE_V0_10,
        _ => VALID_MASK_BEFORE_V0_10,
    }
}

/// The mask bit of `event`: `1 << (event - 1)`; 0 for UNKNOWN and LAST.
fn bit(event: Event) -> u32 {
    match event {
        Event::Unknown | Event::Last => 0,
        e => 1u32 << (e as u32 - 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_bits_are_event_minus_one() {
        assert_eq!(EventSet::of(&[Event::CreateContainer]).mask(), 0x8);
        assert_eq!(EventSet::of(&[Event::StopContainer]).mask(), 0x200);
        assert_eq!(
            EventSet::of(&[Event::CreateContainer, Event::StopContainer]).mask(),
            0x208
        );
        assert_eq!(EventSet::of(&[Event::RunPodSandbox]).mask(), 0x1);
        assert_eq!(EventSet::of(&[Event::UpdatePodSandbox]).mask(), 0x800);
        assert_eq!(EventSet::of(&[Event::Unknown, Event::Last]).mask(), 0);
    }

    #[test]
    fn every_event_round_trips_through_the_set() {
        let all: Vec<Event> = (1..15).map(|n| Event::try_from(n).unwrap()).collect();
        let set = EventSet::of(&all);
        assert_eq!(set.mask(), VALID_MASK_SINCE_V0_10);
        assert_eq!(set.iter().collect::<Vec<_>>(), all);
    }

    #[test]
    fn old_runtimes_never_get_bits_they_do_not_know() {
        let set = EventSet::of(&[Event::CreateContainer, Event::UpdatePodSandbox]);
        for v in [
            None,
            Some(NriVersion::new(0, 8, 0)),
            Some(NriVersion::new(0, 9, 1)),
        ] {
            let (ok, dropped) = set.split_for(v);
            assert_eq!(ok.mask(), 0x8, "{v:?}");
            assert_eq!(dropped.mask(), 0x800, "{v:?}");
        }
        let (ok, dropped) = set.split_for(Some(NriVersion::new(0, 10, 0)));
        assert_eq!(ok.mask(), 0x808);
        assert!(dropped.is_empty());
    }
}
