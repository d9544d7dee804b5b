"""The end-to-end demo: a DLRM with dynamic embeddings on Criteo-format click logs.

    python -m tfra_dynamic_embedding.demo --rows 150000 --epochs 2 --out /tmp/tfra_de_demo

Modules: `criteo` (synthetic Criteo TSV generator and the tf.data reader), `dlrm` (the model),
`run` (train, evaluate, checkpoint, export; `run.main(argv)`). See docs/demo.md.
"""
