//! The named points of the claim lifecycle, the commit and the manager's disk: one list, checked
//! by the compiler, for both kinds of failure test.
//!
//! A crash test aborts the process at a point; a fault test makes the operation at a point fail,
//! wait, block or freeze the manager in-process. Both reach the points through the fault seam
//! ([`crate::faults`]), with hooks the tests package supplies.
//! Every step of prepare, unprepare and commit ([`Point::STEPS`]), every disk operation
//! ([`Point::DISK`]) and every step of a handover ([`Point::HANDOVER`]) is a point, so a new operation cannot be left out of either test by
//! forgetting a string.

use std::{fmt, str::FromStr};

/// A named point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Point {
    /// Prepare: the policy allocated the claim, in memory.
    PrepareAllocated,
    /// Prepare: the state that holds the claim is on disk.
    PrepareSaved,
    /// Prepare: the containers moved off the claim's CPUs have moved.
    PrepareDelivered,
    /// Prepare: the claim's device metadata is on disk; its spec is not written yet.
    PrepareMetadataWritten,
    /// Prepare: the claim's CDI spec is on disk.
    PrepareSpecWritten,
    /// Unprepare: the claim's CDI spec is gone.
    UnprepareSpecRemoved,
    /// Unprepare: the claim's device metadata is gone; it is not released yet.
    UnprepareMetadataRemoved,
    /// Unprepare: the policy released the claim, in memory.
    UnprepareReleased,
    /// Unprepare: the state without the claim is on disk.
    UnprepareSaved,
    /// Unprepare: the containers growing back onto its CPUs were told.
    UnprepareDelivered,
    /// A commit wrote the state file.
    CommitStateWritten,
    /// Disk: saving the state file; fails before anything is written.
    StateSave,
    /// Disk: writing a claim's CDI spec; fails before anything is written.
    SpecWrite,
    /// Disk: after a claim's CDI spec is in place; fails as a failed directory fsync would,
    /// the spec being on disk.
    SpecWritten,
    /// Disk: removing a claim's CDI spec; fails before anything is removed.
    SpecRemove,
    /// Disk: checking whether a claim's CDI spec is on disk.
    SpecCheck,
    /// Disk: moving an unreadable CDI spec aside.
    SpecSetAside,
    /// Disk: writing a claim's device metadata; fails before anything is written.
    MetadataWrite,
    /// Disk: removing a claim's device metadata; fails before anything is removed.
    MetadataRemove,
    /// Handover, the owner: it accepted an agent that asked for the node ([`crate::handover`]).
    HandoverAccepted,
    /// Handover, the owner: the new agent said go; no claim call is in flight any more and
    /// none is admitted.
    HandoverDrained,
    /// Handover, the owner: its connection to the runtime is closed.
    HandoverRuntimeClosed,
    /// Handover, the owner: the last state is saved; nothing of it reaches the disk any more.
    HandoverSaved,
    /// Handover, the owner: its pod is among those the state directory remembers handed the
    /// node over ([`crate::handover::predecessors`]), refused if they ask for it back.
    HandoverRemembered,
    /// Handover, the owner: it holds nothing of the node but the state directory's lock, which
    /// it is about to pass to the successor with `released`; its handover socket is gone.
    HandoverReleased,
    /// Handover, the new agent: the owner accepted it.
    TakeoverAccepted,
    /// Handover, the new agent: the kubelet has connected to it; it tells the owner to go.
    TakeoverGo,
    /// Handover, the new agent: it holds the state directory's lock (passed by the owner, or
    /// taken once free).
    TakeoverLocked,
}

impl Point {
    /// The steps of prepare, unprepare and commit, in the order a prepare and then an unprepare
    /// reach them.
    pub const STEPS: &[Point] = &[
        Point::PrepareAllocated,
        Point::PrepareSaved,
        Point::PrepareDelivered,
        Point::PrepareMetadataWritten,
        Point::PrepareSpecWritten,
        Point::UnprepareSpecRemoved,
        Point::UnprepareMetadataRemoved,
        Point::UnprepareReleased,
        Point::UnprepareSaved,
        Point::UnprepareDelivered,
        Point::CommitStateWritten,
    ];

    /// The steps of a handover, the owner's then the new agent's ([`crate::handover`]).
    pub const HANDOVER: &[Point] = &[
        Point::HandoverAccepted,
        Point::HandoverDrained,
        Point::HandoverRuntimeClosed,
        Point::HandoverSaved,
        Point::HandoverRemembered,
        Point::HandoverReleased,
        Point::TakeoverAccepted,
        Point::TakeoverGo,
        Point::TakeoverLocked,
    ];

    /// Every point, in the order of the lists above.
    pub fn all() -> impl Iterator<Item = Point> {
        Point::STEPS
            .iter()
            .chain(Point::DISK)
            .chain(Point::HANDOVER)
            .copied()
    }

    /// The disk operations.
    pub const DISK: &[Point] = &[
        Point::StateSave,
        Point::SpecWrite,
        Point::SpecWritten,
        Point::SpecRemove,
        Point::SpecCheck,
        Point::SpecSetAside,
        Point::MetadataWrite,
        Point::MetadataRemove,
    ];

    /// Its name, as the crash test's environment and the failure reports spell it.
    pub const fn name(self) -> &'static str {
        match self {
            Point::PrepareAllocated => "prepare.allocated",
            Point::PrepareSaved => "prepare.saved",
            Point::PrepareDelivered => "prepare.delivered",
            Point::PrepareMetadataWritten => "prepare.metadata-written",
            Point::PrepareSpecWritten => "prepare.spec-written",
            Point::UnprepareSpecRemoved => "unprepare.spec-removed",
            Point::UnprepareMetadataRemoved => "unprepare.metadata-removed",
            Point::UnprepareReleased => "unprepare.released",
            Point::UnprepareSaved => "unprepare.saved",
            Point::UnprepareDelivered => "unprepare.delivered",
            Point::CommitStateWritten => "commit.state-written",
            Point::StateSave => "disk.state-save",
            Point::SpecWrite => "disk.spec-write",
            Point::SpecWritten => "disk.spec-written",
            Point::SpecRemove => "disk.spec-remove",
            Point::SpecCheck => "disk.spec-check",
            Point::SpecSetAside => "disk.spec-set-aside",
            Point::MetadataWrite => "disk.metadata-write",
            Point::MetadataRemove => "disk.metadata-remove",
            Point::HandoverAccepted => "handover.accepted",
            Point::HandoverDrained => "handover.drained",
            Point::HandoverRuntimeClosed => "handover.runtime-closed",
            Point::HandoverSaved => "handover.saved",
            Point::HandoverRemembered => "handover.remembered",
            Point::HandoverReleased => "handover.released",
            Point::TakeoverAccepted => "takeover.accepted",
            Point::TakeoverGo => "takeover.go",
            Point::TakeoverLocked => "takeover.locked",
        }
    }
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no point.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a crash or fault point (one of {names})", names = all_names())]
pub struct UnknownPoint(pub String);

fn all_names() -> String {
    Point::all()
        .map(|p| p.name())
        .collect::<Vec<_>>()
        .join(", ")
}

impl FromStr for Point {
    type Err = UnknownPoint;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Point::all()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownPoint(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_point_is_listed_once_and_its_name_parses_back() {
        let all: Vec<Point> = Point::all().collect();
        let unique: std::collections::BTreeSet<Point> = all.iter().copied().collect();
        assert_eq!(unique.len(), all.len(), "a point is listed twice");
        // Exhaustive: a new variant fails to compile here until it is placed in a list.
        for p in &all {
            match p {
                Point::PrepareAllocated
                | Point::PrepareSaved
                | Point::PrepareDelivered
                | Point::PrepareMetadataWritten
                | Point::PrepareSpecWritten
                | Point::UnprepareSpecRemoved
                | Point::UnprepareMetadataRemoved
                | Point::UnprepareReleased
                | Point::UnprepareSaved
                | Point::UnprepareDelivered
                | Point::CommitStateWritten
                | Point::StateSave
                | Point::SpecWrite
                | Point::SpecWritten
                | Point::SpecRemove
                | Point::SpecCheck
                | Point::SpecSetAside
                | Point::MetadataWrite
                | Point::MetadataRemove
                | Point::HandoverAccepted
                | Point::HandoverDrained
                | Point::HandoverRuntimeClosed
                | Point::HandoverSaved
                | Point::HandoverRemembered
                | Point::HandoverReleased
                | Point::TakeoverAccepted
                | Point::TakeoverGo
                | Point::TakeoverLocked => {}
            }
            assert_eq!(p.name().parse::<Point>(), Ok(*p));
        }
        assert_eq!(all.len(), 28, "every variant is in STEPS, DISK or HANDOVER");
        assert!("disk.nowhere".parse::<Point>().is_err());
    }
}
