"""TFRA's `tensorflow_recommenders_addons.utils`: the platform checks TFRA code imports."""
