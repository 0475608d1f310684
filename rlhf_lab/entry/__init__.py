"""The console scripts: ``rlhf-lab`` (:mod:`.run`), ``rlhf-lab-report`` (:mod:`.report`), ``rlhf-lab-server``
(:mod:`.server`), and the sweep callback of a multirun (:mod:`.sweeps`). ``rlhf-lab-suite`` is the lab's research
(:mod:`rlhf_lab_research.suite`)."""
