#!/usr/bin/env python3
"""runs_check.py -- the Tinker SDK's RestClient against a running `zdp serve`
(tests/cli/test_tinker_runs.sh makes the real SDK importable): training runs
and checkpoints listed from --checkpoint-dir, save_state(overwrite=False)
refused for a name that exists (overwrite=True replaces it), delete_checkpoint,
ttl_seconds (listed as expires_at, removed once past it), and session ids that continue across a restart on the same folder.

  runs_check.py URL PHASE STATE_FILE

PHASE "first" trains a little, saves, lists, deletes and writes what it saw to
STATE_FILE; PHASE "second" (a new server on the same --checkpoint-dir) checks
the new run's id differs from the first's and the first run is still listed.
Every failed check prints "FAIL: ..."; the exit status is the failure count.
"""
import json
import sys
import time

import tinker
from tinker import types

FAILURES = 0


def fail(msg):
    global FAILURES
    FAILURES += 1
    print("FAIL: " + msg, flush=True)


def expect_status(fn, status, word, what):
    """fn() must raise the SDK's APIStatusError with this status and a body naming word."""
    try:
        fn()
    except tinker.APIStatusError as e:
        if e.status_code != status or word not in str(e):
            fail(f"{what}: got {e.status_code} {e}, want {status} naming {word!r}")
        return
    except Exception as e:  # a future's failure: the SDK raises its own type
        if word not in str(e):
            fail(f"{what}: got {type(e).__name__}: {e}, want one naming {word!r}")
        return
    fail(f"{what}: no error, want {status}")


def datum(tokens):
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})


def main():
    url, phase, state_file = sys.argv[1], sys.argv[2], sys.argv[3]
    sc = tinker.ServiceClient(base_url=url)
    rest = sc.create_rest_client()
    name = sc.get_server_capabilities().supported_models[0].model_name
    tc = sc.create_lora_training_client(base_model=name, rank=0)  # --full-finetune
    run_id = tc.model_id
    if phase == "second":
        first = json.load(open(state_file))
        if run_id == first["run_id"]:
            fail(f"a restarted server handed out run id {run_id} again")
        ids = [r.training_run_id for r in rest.list_training_runs().result().training_runs]
        if first["run_id"] not in ids or run_id not in ids:
            fail(f"list_training_runs after the restart: {ids}, want {first['run_id']} and {run_id}")
        cks = [c.checkpoint_id for c in rest.list_checkpoints(first["run_id"]).result().checkpoints]
        if cks != ["weights/kept"]:
            fail(f"the first run's checkpoints after the restart: {cks}, want ['weights/kept']")
        tc.load_state(first["kept_path"]).result()
        print(f"runs_check second: {run_id} beside {first['run_id']}")
        return

    data = [datum([1, 2, 3, 4, 5, 6, 7, 8]), datum([3, 1, 4, 1, 5, 9, 2, 6])]
    tc.forward_backward(data, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    kept = tc.save_state("kept").result().path
    gone = tc.save_state("gone").result().path
    # The SDK's default is overwrite=False: the same name again is refused.
    expect_status(lambda: tc.save_state("kept").result(), 400, "overwrite", "save_state of an existing name")
    again = tc.save_state("kept", overwrite=True).result().path
    if again != kept:
        fail(f"save_state(overwrite=True): {again}, want {kept}")
    sampler = tc.save_weights_for_sampler("s1w").result().path

    run = rest.get_training_run(run_id).result()
    if run.training_run_id != run_id or run.base_model != name or run.is_lora:
        fail(f"get_training_run: {run}")
    if run.last_checkpoint is None or run.last_sampler_checkpoint is None:
        fail(f"get_training_run: last checkpoints missing: {run}")
    elif run.last_sampler_checkpoint.tinker_path != sampler:
        fail(f"last_sampler_checkpoint {run.last_sampler_checkpoint.tinker_path}, want {sampler}")
    listed = rest.list_checkpoints(run_id).result().checkpoints
    got = sorted((c.checkpoint_id, c.checkpoint_type, c.tinker_path) for c in listed)
    want = sorted([("weights/kept", "training", kept), ("weights/gone", "training", gone),
                   ("sampler_weights/s1w", "sampler", sampler)])
    if got != want:
        fail(f"list_checkpoints: {got}, want {want}")
    if any(c.size_bytes is None or c.size_bytes <= 0 for c in listed):
        fail(f"list_checkpoints: sizes {[c.size_bytes for c in listed]}")
    user = rest.list_user_checkpoints().result()
    if {c.tinker_path for c in user.checkpoints} != {kept, gone, sampler} or user.cursor.total_count != 3:
        fail(f"list_user_checkpoints: {user}")
    page = rest.list_user_checkpoints(limit=1, offset=1).result()
    if len(page.checkpoints) != 1 or page.cursor.offset != 1 or page.cursor.total_count != 3:
        fail(f"list_user_checkpoints(limit=1, offset=1): {page}")
    runs = rest.list_training_runs().result()
    if [r.training_run_id for r in runs.training_runs] != [run_id]:
        fail(f"list_training_runs: {runs}")

    if rest.get_training_run_by_tinker_path(kept).result().training_run_id != run_id:
        fail("get_training_run_by_tinker_path: not the run")
    info = rest.get_weights_info_by_tinker_path(kept).result()
    if info.base_model != name or info.is_lora:
        fail(f"get_weights_info_by_tinker_path: {info}")
    # set_checkpoint_ttl_from_tinker_path: an expiry shows, None clears it.
    rest.set_checkpoint_ttl_from_tinker_path(kept, 3600).result()
    exp = {c.tinker_path: c.expires_at for c in rest.list_checkpoints(run_id).result().checkpoints}
    if exp.get(kept) is None:
        fail(f"set_checkpoint_ttl(3600): expires_at {exp.get(kept)}")
    rest.set_checkpoint_ttl_from_tinker_path(kept, None).result()
    exp = {c.tinker_path: c.expires_at for c in rest.list_checkpoints(run_id).result().checkpoints}
    if exp.get(kept) is not None:
        fail(f"set_checkpoint_ttl(None): expires_at {exp.get(kept)}, want None")
    expect_status(lambda: rest.set_checkpoint_ttl_from_tinker_path(kept, -5).result(), 400, "ttl_seconds",
                  "set_checkpoint_ttl(-5)")
    expect_status(lambda: rest.get_checkpoint_archive_url_from_tinker_path(kept).result(), 404,
                  "no such endpoint", "get_checkpoint_archive_url (not offered)")

    rest.delete_checkpoint_from_tinker_path(gone).result()
    rest.delete_checkpoint(run_id, "sampler_weights/s1w").result()
    left = sorted(c.checkpoint_id for c in rest.list_checkpoints(run_id).result().checkpoints)
    if left != ["weights/kept"]:
        fail(f"after delete_checkpoint: {left}, want ['weights/kept']")
    expect_status(lambda: tc.load_state(gone).result(), 400, "gone", "load_state of a deleted checkpoint")
    tc.load_state(kept).result()  # the kept one still loads
    expect_status(lambda: rest.delete_checkpoint(run_id, "weights/gone").result(), 404, "checkpoint_id",
                  "delete of a deleted checkpoint")
    expect_status(lambda: rest.get_training_run("s999:train:0").result(), 404, "training_run_id",
                  "get_training_run of an unknown run")
    expect_status(lambda: rest.list_checkpoints("nope").result(), 404, "training_run_id",
                  "list_checkpoints of an unknown run")
    # ttl_seconds: listed with expires_at, then removed once past it.
    expect_status(lambda: tc.save_state("bad-ttl", ttl_seconds=0).result(), 400, "ttl_seconds", "ttl_seconds = 0")
    brief = tc.save_state("brief", ttl_seconds=2).result().path
    brief_s = tc.save_weights_for_sampler("brief-s", ttl_seconds=2).result().path
    listed = {c.tinker_path: c for c in rest.list_checkpoints(run_id).result().checkpoints}
    if brief not in listed or brief_s not in listed or listed[brief].expires_at is None:
        fail(f"checkpoints saved with ttl_seconds: {sorted(listed)}, want {brief} and {brief_s} with expires_at")
    if listed.get(kept) is None or listed[kept].expires_at is not None:
        fail(f"a checkpoint without ttl_seconds: {listed.get(kept)}, want expires_at None")
    for _ in range(120):
        left = {c.tinker_path for c in rest.list_checkpoints(run_id).result().checkpoints}
        if brief not in left and brief_s not in left:
            break
        time.sleep(0.1)
    else:
        fail(f"ttl_seconds=2: still listed after 12 s: {sorted(left)}")
    expect_status(lambda: tc.load_state(brief).result(), 400, "brief", "load_state of an expired checkpoint")
    json.dump({"run_id": run_id, "kept_path": kept}, open(state_file, "w"))
    print(f"runs_check first: {run_id}, {len(listed)} checkpoints listed, 2 deleted")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 -- any unexpected error is a failure
        import traceback
        traceback.print_exc()
        fail(f"{type(e).__name__}: {e}")
    sys.exit(min(FAILURES, 100))
