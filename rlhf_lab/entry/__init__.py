"""The console scripts: ``rlhf-lab`` (:mod:`.run`), ``rlhf-lab-report`` (:mod:`.report`), ``rlhf-lab-suite``
(:mod:`.suite`), ``rlhf-lab-server`` (:mod:`.server`), and the sweep callback of a multirun (:mod:`.sweeps`)."""
