"""What the job is: SageMaker's files under /opt/ml read into typed, frozen values.

paths (the /opt/ml layout), sagemaker_files (resourceconfig/inputdataconfig JSON), hyperparameters (SDK
decoding, launcher keys vs script arguments), launcher_options (the reserved keys as typed options, each
declared once), mpi_defaults (mpirun's defaults, declared once), hardware (what this host has),
instance_groups (heterogeneous clusters), sdk_v3 (ModelTrainer's files), and job (all of it, loaded once and
validated, whichever SDK wrote the files). How an option is declared, read and documented is ../option_spec.py
(the lowest layer: the rank reads its environment options with it too).
"""
