"""PostTrain Studio's RL algorithm library: verl's core_algos and torch_functional, as pure
tensor functions under verl's names.

Import from the modules: advantage estimators from ``advantages``
(``get_adv_estimator_fn(algorithm.adv_estimator)``), policy losses from the ``policy_loss``
package (``base.get_policy_loss_fn(actor.policy_loss.loss_mode)``), their aggregation from
``loss_aggregation``, KL penalties and controllers from ``kl``
(``get_kl_controller(algorithm.kl_ctrl)``), the critic's loss from ``value``, and ``pf_ppo``,
``rollout_correction``, ``torch_functional``. ``registry`` is the registries' one mechanism and
``names`` the names they accept, read without torch. The package re-exports nothing, so the
config reads ``engine.algorithms.names`` without loading torch. Nothing here knows about models,
workers or Ray.
"""
