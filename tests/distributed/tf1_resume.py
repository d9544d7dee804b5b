"""A TF1 chief (MonitoredTrainingSession against `tfra-de server` PS tasks) that survives a PS
loss by restart: phase "train" checkpoints every 2 steps and trains until a PS dies (it then
fails with StepDeadlineError); phase "resume", started after the PS was restarted, lets the
session restore the latest checkpoint, reports the restored state and trains 2 more steps.

    python tf1_resume.py '<config JSON>'   # keys: phase, scope, ckpt_dir, sync_dir

Prints one JSON line last (phase "resume"). Uses tf1_trainer.py's model and batches.
"""

import json
import os
import sys

import tf1_trainer as trainer


def main(config):
    # pylint: disable-next=import-outside-toplevel
    from tfra_dynamic_embedding.distributed import failures
    failures.fail_fast_environment()
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    tf.compat.v1.disable_eager_execution()
    spec = json.loads(os.environ["TF_CONFIG"])["cluster"]
    session_config = failures.session_config("chief", 0, operation_timeout_in_ms=20000)
    server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name="chief", task_index=0,
                                  config=session_config)
    ps = len(spec["ps"])
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
            ps_tasks=ps, worker_device="/job:chief/task:0", cluster=spec)):
        model = trainer.build("adam", [f"/job:ps/replica:0/task:{i}" for i in range(ps)],
                              config["scope"])
    resume = config["phase"] == "resume"
    result = {}
    with failures.StepDeadlineHook(5) as deadline:
        with tf.compat.v1.train.MonitoredTrainingSession(
                master=server.target, is_chief=True, checkpoint_dir=config["ckpt_dir"],
                save_checkpoint_steps=None if resume else 2, save_checkpoint_secs=None,
                save_summaries_steps=None, save_summaries_secs=None, log_step_count_steps=None,
                hooks=[deadline], config=session_config) as sess:
            if resume:
                result["restored"] = trainer.state(sess, model)
            steps = 2 if resume else 10**6
            for ran, (ids, labels) in enumerate(trainer.batches("chief", 0, steps), 1):
                sess.run(model["train_op"], {model["ids"]: ids, model["labels"]: labels})
                if ran == 5 and not resume:
                    trainer._touch(os.path.join(config["sync_dir"], "training"))  # pylint: disable=protected-access
            result["global_step"] = int(sess.run(model["global_step"]))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
