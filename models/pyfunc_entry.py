"""MLflow "models from code" entry point of the served recommender.

``models.pyfunc.log_recommender`` logs this file as the model's code instead of a pickled
object (no cloudpickle on load); MLflow runs it when loading the model, with the project
packages (logged as ``code_paths``) importable. Nothing else imports it.
"""

from mlflow.models import set_model

from models.pyfunc import SidRecommenderModel

set_model(SidRecommenderModel())
