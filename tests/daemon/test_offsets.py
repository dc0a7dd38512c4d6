"""The offset tracker: what is applied, durable and committed, and what a commit may carry."""

from __future__ import annotations

from monitor.daemon.offsets import OffsetTracker

A, B = ("t", 0), ("t", 1)


def test_with_checkpoints_only_durable_offsets_are_committed() -> None:
    offsets = OffsetTracker(durable_commits=True)
    offsets.mark_applied({A: 10, B: 3})
    assert offsets.to_commit() == {} and not offsets.all_durable()
    offsets.mark_durable({A: 7})
    assert offsets.to_commit() == {A: 7} and offsets.resume_offsets() == {A: 7}
    offsets.mark_committed({A: 7})
    assert offsets.to_commit() == {}
    offsets.mark_durable({A: 10, B: 3})
    assert offsets.all_durable() and offsets.to_commit() == {A: 10, B: 3}


def test_without_checkpoints_applied_offsets_are_committed() -> None:
    offsets = OffsetTracker(durable_commits=False)
    offsets.mark_applied({A: 4})
    assert offsets.to_commit() == {A: 4} and offsets.resume_offsets() == {A: 4}


def test_offsets_never_move_backwards_and_assignment_accounts_for_what_precedes_it() -> None:
    offsets = OffsetTracker(durable_commits=True)
    offsets.mark_applied({A: 9})
    offsets.mark_applied({A: 5})
    assert offsets.applied() == {A: 9}
    offsets.mark_assigned({A: 3, B: 20})  # sought to 20 on B: 0..19 are another replica's or done
    assert offsets.applied() == {A: 9, B: 19} and offsets.durable() == {A: 2, B: 19}


def test_restore_sets_applied_and_durable_together() -> None:
    offsets = OffsetTracker(durable_commits=True)
    offsets.mark_applied({A: 100})
    offsets.restore({A: 40})
    assert offsets.applied() == offsets.durable() == {A: 40} and offsets.all_durable()


def test_a_capture_taken_before_a_reset_does_not_make_the_old_offset_durable() -> None:
    """A checkpoint captured at 999, written while the partition is reset to 0 (a recreated topic),
    leaves the reset partition's new offsets alone and still marks the other partitions durable."""
    offsets = OffsetTracker(durable_commits=True)
    offsets.mark_applied({A: 999, B: 50})
    captured, generation = offsets.capture()
    offsets.reset({A: 0})
    offsets.mark_durable(captured, generation)
    assert offsets.durable() == {A: -1, B: 50} and offsets.to_commit() == {A: -1, B: 50}
    offsets.mark_applied({A: 599})
    captured, generation = offsets.capture()  # taken after the reset: it counts
    offsets.mark_durable(captured, generation)
    assert offsets.durable() == {A: 599, B: 50}


def test_what_a_checkpoint_written_across_a_reset_may_still_claim() -> None:
    """A replica publishes the offsets its checkpoint reflects (daemon/checkpointing.py hands them to
    its observer): a partition reset while that checkpoint was written is left out of them, the
    others kept, and offsets captured after the reset are all current."""
    offsets = OffsetTracker(durable_commits=True)
    offsets.mark_applied({A: 999, B: 50})
    captured, generation = offsets.capture()
    offsets.reset({A: 0})
    assert offsets.still_current(captured, generation) == {B: 50}
    offsets.mark_applied({A: 10})
    captured, generation = offsets.capture()
    assert offsets.still_current(captured, generation) == {A: 10, B: 50}
